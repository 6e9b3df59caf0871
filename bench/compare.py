"""Compare this tree's speed with a baseline commit in one run.

Usage: ``python3 bench/compare.py REV [--quick] [--rounds N] [--only drain,enqueue,...]
[--postgres URL]``. REV's ``app/`` is extracted with ``git archive`` into a
temporary folder; both checkouts then run the same scenarios (this tree's
``bench/`` code, so the measurement is identical and only ``app`` differs),
each measurement in a fresh process, in interleaved rounds (A B, then B A, so
a drift of the machine's speed during the run falls on both sides). Printed:
the median of each side over the rounds and the ratio this tree / REV.

Scenarios: the SQLite drain, single enqueue (1 and 16 threads) and bulk
enqueue, and the same four on PostgreSQL when a URL is given (``--postgres``, or
``JOBDECK_BENCH_POSTGRES_URL``): each run gets its own schema, dropped after.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

FULL = {"drain": 100_000, "enqueue": 5_000, "enqueue16": 5_000, "enqueue_many": 200_000, "pg_drain": 20_000,
        "pg_enqueue": 3_000, "pg_enqueue16": 5_000, "pg_enqueue_many": 100_000}  # fmt: skip
QUICK = {"drain": 5_000, "enqueue": 300, "enqueue16": 300, "enqueue_many": 10_000, "pg_drain": 2_000,
         "pg_enqueue": 300, "pg_enqueue16": 320, "pg_enqueue_many": 10_000}  # fmt: skip
TINY = {"drain": 300, "enqueue": 30, "enqueue16": 32, "enqueue_many": 2_000, "pg_drain": 300,
        "pg_enqueue": 30, "pg_enqueue16": 32, "pg_enqueue_many": 2_000}  # fmt: skip
SQLITE_SCENARIOS = ("drain", "enqueue", "enqueue16", "enqueue_many")
PG_SCENARIOS = ("pg_drain", "pg_enqueue", "pg_enqueue16", "pg_enqueue_many")


def _on_postgres(url: str, run: Callable[[str], float]) -> float:
    """``run(scoped_url)`` in a schema of its own, dropped after."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, poolclass=NullPool)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        parsed = make_url(url)
        scoped = parsed.set(query={**parsed.query, "options": f"-csearch_path={schema}"})
        return run(scoped.render_as_string(hide_password=False))
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def measure(scenario: str, n: int, work: Path, postgres: str | None = None) -> float:
    """One figure (jobs/s) of ``scenario`` with the ``app`` on ``sys.path``."""
    from bench import jobdeck_bench as jb

    runs: dict[str, Callable[[], float]] = {
        "drain": lambda: jb.drain(work, n, "FULL"),
        "enqueue": lambda: jb.enqueue_single(work, n, "FULL"),
        "enqueue16": lambda: jb.enqueue_single(work, n, "FULL", 16),
        "enqueue_many": lambda: jb.enqueue_many(work, n),
        "pg_drain": lambda: _on_postgres(postgres or "", lambda url: jb.drain(work, n, database_url=url)),
        "pg_enqueue": lambda: _on_postgres(postgres or "", lambda url: jb.enqueue_single(work, n, database_url=url)),
        "pg_enqueue16": lambda: _on_postgres(
            postgres or "", lambda url: jb.enqueue_single(work, n, producers=16, database_url=url)
        ),
        "pg_enqueue_many": lambda: _on_postgres(postgres or "", lambda url: jb.enqueue_many(work, n, database_url=url)),
    }
    return runs[scenario]()


def _child(args: argparse.Namespace) -> int:
    """``--child SCENARIO N``: warm up, measure once, print the rate as JSON."""
    scenario, n = args.child[0], int(args.child[1])
    # An editable install's import hook would fill in a module the baseline lacks from the
    # installed tree, mixing the two checkouts: only PYTHONPATH (this child's checkout) counts.
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
    root = Path.cwd().resolve()
    _import_jobdeck_from(root)
    import jobdeck

    if not Path(jobdeck.__file__ or "").resolve().is_relative_to(root):
        raise RuntimeError(f"jobdeck imported from {jobdeck.__file__}, not from the checkout {root}")
    with tempfile.TemporaryDirectory(prefix="jobdeck-compare-") as tmp:
        measure(scenario, max(10, n // 10), Path(tmp), args.postgres)
        rate = measure(scenario, n, Path(tmp), args.postgres)
    print(json.dumps({"rate": rate}))
    return 0


_MOVED = {
    **{f"jobdeck.core.{m}": f"app.{m}" for m in (
        "states", "errors", "clock", "config", "validation", "fingerprint", "crashpoints", "forks", "structured_logs")},
    **{f"jobdeck.jobs.{m}": f"app.{m}" for m in (
        "handlers", "flow", "flow_claim", "queues", "unique", "snooze", "artifacts", "joblogs", "workflows", "waiting")},
}  # fmt: skip
"""Where the modules of ``jobdeck.core`` and ``jobdeck.jobs`` lived in a tree from before
they moved, when the import name was still ``app``."""


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A baseline from before the rename: ``jobdeck.X`` is the module ``app.X``
    (one module object under both names, so its registries are shared)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "jobdeck" and not fullname.startswith("jobdeck."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name in ("jobdeck.core", "jobdeck.jobs"):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            return module
        return importlib.import_module(_MOVED.get(spec.name) or "app" + spec.name[len("jobdeck") :])

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _import_jobdeck_from(root: Path) -> None:
    """Make ``import jobdeck`` load this checkout's ``app/`` folder (its import
    name since the rename), or alias ``app`` in a baseline from before it."""
    init = root / "app" / "__init__.py"
    if (root / "app" / "core").is_dir():
        spec = importlib.util.spec_from_file_location("jobdeck", init, submodule_search_locations=[str(root / "app")])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["jobdeck"] = module
        spec.loader.exec_module(module)
    else:
        sys.meta_path.insert(0, _OldNames())


def baseline_checkout(rev: str, into: Path) -> Path:
    """REV's ``app/`` (``git archive``) beside a copy of this tree's ``bench/*.py``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "app"],
                             capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "bench").mkdir()
    for path in (REPO / "bench").glob("*.py"):
        shutil.copy(path, into / "bench" / path.name)
    return into


def run_child(root: Path, scenario: str, n: int, postgres: str | None) -> float:
    env = dict(os.environ, PYTHONPATH=str(root))
    for name in [k for k in env if k.startswith("JOBDECK_")]:
        env.pop(name)
    command = [sys.executable, "-m", "bench.compare", "--child", scenario, str(n)]
    if postgres:
        command += ["--postgres", postgres]
    out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{scenario} in {root}: {out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def compare(rev: str, counts: dict[str, int], scenarios: list[str], rounds: int,
            postgres: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Interleaved rounds of every scenario on both checkouts; the medians and ratios."""
    with tempfile.TemporaryDirectory(prefix="jobdeck-baseline-") as tmp:
        sides = {"this tree": REPO, rev: baseline_checkout(rev, Path(tmp))}
        runs: dict[str, dict[str, list[float]]] = {s: {side: [] for side in sides} for s in scenarios}
        for i in range(rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for scenario in scenarios:
                for side in order:
                    rate = run_child(sides[side], scenario, counts[scenario], postgres)
                    runs[scenario][side].append(rate)
                    log(f"  round {i + 1}/{rounds} {scenario:<12} {side}: {rate:,.0f} jobs/s")
    result: dict[str, Any] = {}
    for scenario, by_side in runs.items():
        mine, base = (statistics.median(by_side[side]) for side in sides)
        result[scenario] = {"this": mine, "base": base, "ratio": mine / base, "runs": by_side}
    return result


def table(rev: str, counts: dict[str, int], result: dict[str, Any]) -> str:
    lines = [f"| scenario (jobs/s, median) | this tree | {rev} | this / {rev} |", "|---|---|---|---|"]
    for scenario, r in result.items():
        lines.append(f"| {scenario} ({counts[scenario]:,} jobs) | {r['this']:,.0f} | {r['base']:,.0f} | "
                     f"{r['ratio']:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", nargs="?", help="the baseline: any git revision (main, HEAD~3, a commit)")
    ap.add_argument("--quick", action="store_true", help="small counts: a few minutes")
    ap.add_argument("--rounds", type=int, help="rounds per scenario (default 5, --quick 3)")
    ap.add_argument("--only", help=f"scenarios, comma-separated (default: {','.join(SQLITE_SCENARIOS)}[,pg_*])")
    ap.add_argument("--postgres", default=os.environ.get("JOBDECK_BENCH_POSTGRES_URL"),
                    help="a PostgreSQL URL: adds the pg_ scenarios (a schema per run, dropped after)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args)
    if not args.rev:
        ap.error("name the baseline revision")
    counts = TINY if args.tiny else QUICK if args.quick else FULL
    default = [*SQLITE_SCENARIOS, *(PG_SCENARIOS if args.postgres else [])]
    scenarios = args.only.split(",") if args.only else default
    unknown = [s for s in scenarios if s not in counts]
    if unknown or (set(scenarios) & set(PG_SCENARIOS) and not args.postgres):
        ap.error(f"unknown scenarios {unknown}" if unknown else "the pg_ scenarios need --postgres URL")
    rounds = args.rounds or (1 if args.tiny else 3 if args.quick else 5)
    print(f"comparing this tree with {args.rev}: {', '.join(scenarios)}, {rounds} rounds", flush=True)
    result = compare(args.rev, counts, scenarios, rounds, args.postgres, log=lambda m: print(m, flush=True))
    print()
    print(table(args.rev, counts, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
