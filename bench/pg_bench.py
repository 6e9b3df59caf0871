"""Scenario 10: Jobdeck on PostgreSQL against PgQueuer, oban-py and
Procrastinate, the same no-op job, interleaved rounds.

Usage: ``python3 -m bench.pg_bench [--rounds N] [--quick]
[--only drain1,drain2,enqueue1,enqueue1000,latency]
[--systems jobdeck,pgqueuer,oban,procrastinate]``. ``--systems jobdeck``
needs no peer and no virtualenv: Jobdeck's own PostgreSQL figures.

Scenarios (``bench/peers/pg_harness.py`` measures them the same way for
every system, each measurement in a fresh process on a fresh database):
drain 20,000 pre-enqueued jobs with 1 and with 2 consumer processes
(``VACUUM ANALYZE`` after the fill, jobs/s from the consumers' go until the
database counts all completed); enqueue 1 job per call, sequential, durable
on return; enqueue 1,000 jobs per call; enqueue-to-handler-start latency at
idle with the consumer in another process (p50/p99 ms).

Rounds: round r runs every scenario with the systems in an order rotated by
r (A B C D, then B C D A, ...). Printed per scenario: each system's median
over the rounds and Jobdeck's ratio to each peer, taken within each round,
then the median of those ratios (above 1: Jobdeck ahead; for latency the
peer's time over Jobdeck's). JSON with every run under bench/results/.

Consumers: Jobdeck, what ``jobdeck worker`` runs (4 threads, its default);
PgQueuer 1.6.0 with uvloop, ``batch_size=250``; oban-py 0.7.0 (Python 3.12)
with queue limit 100; Procrastinate 3.10.0 with concurrency 100. The peers
are installed on first use, each into a virtualenv of its own
(``bench/.venv-pgqueuer``, ``bench/.venv-oban``, and ``bench/.venv`` of
``bench/run.py`` for Procrastinate).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, machine  # noqa: E402

PEERS_DIR = REPO / "bench" / "peers"
SYSTEMS = ("jobdeck", "pgqueuer", "oban", "procrastinate")
LABELS = {"jobdeck": "Jobdeck", "pgqueuer": "PgQueuer", "oban": "oban-py", "procrastinate": "Procrastinate"}
PINS = {
    "pgqueuer": ["pgqueuer==1.6.0", "uvloop==0.23.0", "asyncpg==0.32.0", "psycopg[binary]==3.3.9"],
    "oban": ["oban==0.7.0"],
}
SCENARIOS: dict[str, tuple[str, list[str]]] = {
    "drain1": ("drain", ["--procs", "1"]),
    "drain2": ("drain", ["--procs", "2"]),
    "enqueue1": ("enqueue1", []),
    "enqueue1000": ("enqueue1000", []),
    "latency": ("latency", []),
}
FULL = {"drain1": 20_000, "drain2": 20_000, "enqueue1": 2_000, "enqueue1000": 20_000, "latency": 200}
QUICK = {"drain1": 1_000, "drain2": 1_000, "enqueue1": 100, "enqueue1000": 2_000, "latency": 20}
TITLES = {
    "drain1": "drain {n:,} jobs, 1 consumer process (jobs/s)",
    "drain2": "drain {n:,} jobs, 2 consumer processes (jobs/s)",
    "enqueue1": "enqueue 1 job/call, sequential, {n:,} jobs (jobs/s)",
    "enqueue1000": "enqueue 1,000 jobs/call, {n:,} jobs (jobs/s)",
}


# -- the peers' virtualenvs ------------------------------------------------------


def python312() -> str:
    """Python 3.12 for oban-py: pyenv's, else ``python3.12`` on PATH."""

    def patch(path: str) -> int:  # 3.12.10 after 3.12.9
        m = re.search(r"/3\.12\.(\d+)/", path)
        return int(m.group(1)) if m else -1

    found = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12"), key=patch)
    python = found[-1] if found else shutil.which("python3.12")
    if not python:
        raise RuntimeError(
            "oban-py needs Python 3.12, and there is none: no /root/.pyenv/versions/3.12.*/bin/python3.12 and no "
            "python3.12 on PATH (install it, e.g. `pyenv install 3.12`, or leave oban out with --systems)"
        )
    return python


def _pinned(python: Path, pins: list[str]) -> bool:
    check = ("import importlib.metadata as m, sys; pins = [p.split('==') for p in sys.argv[1:]]; "
             "sys.exit(any(m.version(name.split('[')[0]) != version for name, version in pins))")  # fmt: skip
    return subprocess.run([python, "-c", check, *pins], capture_output=True).returncode == 0


def peer_python(system: str) -> Path:
    """The interpreter of ``system``'s virtualenv, made on first use."""
    if system == "procrastinate":
        from bench.run import ensure_venv

        return ensure_venv()
    home = REPO / "bench" / f".venv-{system}"
    python = home / "bin" / "python"
    if not python.exists():
        if system == "oban":
            subprocess.run([python312(), "-m", "venv", str(home)], check=True)
        else:
            venv.create(home, with_pip=True)
    if not _pinned(python, PINS[system]):
        subprocess.run([python, "-m", "pip", "install", "-q", *PINS[system]], check=True)
    return python


def versions(python: Path, system: str) -> dict[str, str]:
    names = {"pgqueuer": ["pgqueuer", "uvloop", "asyncpg"], "oban": ["oban", "uvloop", "psycopg"],
             "procrastinate": ["procrastinate", "psycopg"]}[system]  # fmt: skip
    code = "import importlib.metadata as m, json, sys, platform; print(json.dumps({'python': platform.python_version(), **{n: m.version(n) for n in sys.argv[1:]}}))"  # noqa: E501
    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


# -- one measurement ---------------------------------------------------------------


def command(system: str, python: Path | None, scenario: str, n: int) -> tuple[list[str], Path, dict[str, str]]:
    what, extra = SCENARIOS[scenario]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    if system == "jobdeck":
        env["PYTHONPATH"] = str(REPO)
        return [sys.executable, "-m", "bench.pg_jobdeck", what, str(n), *extra], REPO, env
    return [str(python), "pg_peers.py", system, what, str(n), *extra], PEERS_DIR, env


def measure(system: str, python: Path | None, scenario: str, n: int, **extra_env: str) -> dict[str, Any]:
    """One figure in a fresh process: ``{"rate": ...}`` or ``{"p50_ms", "p99_ms"}``,
    or ``{"error": ...}`` (the run goes on; the table shows it). ``extra_env``
    goes to its environment (``BENCH_JOBDECK_ASYNC="1"``)."""
    argv, cwd, env = command(system, python, scenario, n)
    env.update(extra_env)
    try:
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 1,800 s"}
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}",
                "stderr": out.stderr[-3000:]}  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _figure(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"error: {run['error']}"
    if "rate" in run:
        return f"{run['rate']:,.0f} jobs/s"
    return f"p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms"


# -- rounds, medians and ratios ---------------------------------------------------------


def rounds_of(counts: dict[str, int], scenarios: list[str], systems: list[str], rounds: int,
              log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Every scenario for every system, ``rounds`` times, the order of
    systems rotated each round; then the medians and Jobdeck's ratios."""
    pythons = {s: (None if s == "jobdeck" else peer_python(s)) for s in systems}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {sc: {s: [] for s in systems} for sc in scenarios}
    for r in range(rounds):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        for scenario in scenarios:
            for system in order:
                run = measure(system, pythons[system], scenario, counts[scenario])
                runs[scenario][system].append(run)
                log(f"  round {r + 1}/{rounds} {scenario:<11} {LABELS[system]:<13} {_figure(run)}")
    return {
        "versions": {s: versions(p, s) for s, p in pythons.items() if p is not None},
        "runs": runs,
        "summary": summarize(runs),
    }


def _keys(scenario: str) -> list[str]:
    if scenario == "latency":
        return ["p50_ms", "p99_ms"]
    return ["rate", "rss_mb", *CPU_KEYS] if scenario.startswith("drain") else ["rate"]


CPU_KEYS = ("consumer_cpu_us", "server_cpu_us")
"""A drain's CPU per job: the consumer processes' (user + system) and every
PostgreSQL server process's, from go to the last completion
(``pg_harness.drain``). On 2 cores their sum bounds the rate a system can
reach: where the time goes, measured for every system in the same run."""


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per scenario and figure: each system's median over its good rounds,
    and Jobdeck's ratio to each peer per round (both measured), then their
    median. Ratios read "Jobdeck ahead by": rates Jobdeck / peer, times
    peer / Jobdeck."""
    out: dict[str, Any] = {}
    for scenario, by_system in runs.items():
        for key in _keys(scenario):
            row: dict[str, Any] = {"median": {}, "ratio": {}, "errors": {}}
            for system, values in by_system.items():
                good = [v[key] for v in values if key in v]
                row["median"][system] = statistics.median(good) if good else None
                row["errors"][system] = sum("error" in v for v in values)
            jobdeck = by_system.get("jobdeck", [])
            for system, values in by_system.items():
                if system == "jobdeck":
                    continue
                pairs = [(j[key], p[key]) for j, p in zip(jobdeck, values, strict=False) if key in j and key in p]
                ratios = [(jd / peer if key == "rate" else peer / jd) for jd, peer in pairs if jd > 0 and peer > 0]
                row["ratio"][system] = statistics.median(ratios) if ratios else None
            out[f"{scenario}:{key}"] = row
    return out


def _title(scenario: str, key: str, n: int) -> str:
    if scenario == "latency":
        return f"latency enqueue→start at idle, {key[:3]}, {n:,} jobs (ms)"
    if key == "rss_mb":
        return f"RSS of a consumer at the end of the {scenario[-1]}-process drain (MB)"
    if key in CPU_KEYS:
        whose = "consumer processes'" if key == "consumer_cpu_us" else "database server's"
        return f"CPU per job in the {scenario[-1]}-process drain, the {whose} (µs)"
    return TITLES[scenario].format(n=n)


def table(result: dict[str, Any]) -> str:
    systems = result["systems"]
    lines = [
        f"| scenario | {' | '.join(LABELS[s] for s in systems)} |",
        "|---|" + "---|" * len(systems),
    ]
    for name, row in result["summary"].items():
        scenario, key = name.split(":")
        cells = []
        for system in systems:
            value, ratio = row["median"].get(system), row["ratio"].get(system)
            text = "–" if value is None else f"{value:,.1f}" if key != "rate" else f"{value:,.0f}"
            if ratio is not None:
                text += f" ({ratio:.2f}x)"
            if row["errors"].get(system):
                text += f" [{row['errors'][system]} failed]"
            cells.append(text)
        lines.append(f"| {_title(scenario, key, result['counts'][scenario])} | {' | '.join(cells)} |")
    m = result["machine"]
    lines += [
        "",
        f"Median of {result['rounds']} interleaved rounds; (x): Jobdeck's ratio to that peer, the median of the "
        "per-round ratios, above 1 when Jobdeck is ahead (jobs/s: Jobdeck / peer; latency, RSS, CPU: peer / Jobdeck). "
        f"Machine: {m['cores']} cores, Python {m['python']}, load at start {m['loadavg_at_start']}.",
    ]
    if "stack_floor_mb" in result:
        lines.append(
            f"A fresh Python {m['python']} that has imported only {', '.join(STACK)} and opened one connection "
            f"holds {result['stack_floor_mb']:.1f} MB: the floor under Jobdeck's RSS rows."
        )
    return "\n".join(lines)


def check_postgres() -> None:
    """A clear message when the local server is not there (before any venv is made)."""
    code = "import psycopg, sys; psycopg.connect(sys.argv[1], connect_timeout=5).close()"
    admin = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    out = subprocess.run([sys.executable, "-c", code, admin], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"PostgreSQL is not reachable at {admin}: {out.stderr.strip().splitlines()[-1:]}")


def run(quick: bool = False, rounds: int | None = None, scenarios: list[str] | None = None,
        systems: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """The whole comparison as a result dict (also what bench/run.py's scenario 10 keeps)."""
    check_postgres()
    counts = dict(QUICK if quick else FULL)
    scenarios = scenarios or list(SCENARIOS)
    systems = systems or list(SYSTEMS)
    rounds = rounds or (1 if quick else 5)
    log(f"PostgreSQL: {', '.join(scenarios)} for {', '.join(LABELS[s] for s in systems)}, {rounds} rounds")
    result: dict[str, Any] = {"machine": machine(), "mode": "quick" if quick else "full", "counts": counts,
                              "rounds": rounds, "systems": systems, "started": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    t0 = time.monotonic()
    result.update(rounds_of(counts, scenarios, systems, rounds, log))
    result["stack_floor_mb"] = stack_floor()
    result["seconds"] = time.monotonic() - t0
    return result


STACK = ("sqlalchemy", "sqlalchemy.dialects.postgresql.psycopg")
"""What any Jobdeck process on PostgreSQL imports before a line of its own:
the product's fixed stack (SQLAlchemy 2's Core: the tables are Core tables,
and no process loads the ORM) and the driver."""


def stack_floor() -> float:
    """The RSS (MB) of a fresh interpreter that has imported ``STACK`` and
    nothing else, with one connection open (libpq and its TLS library are
    loaded on the first connect): the floor under the consumer's RSS row."""
    admin = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    code = ("import sys, importlib; [importlib.import_module(m) for m in sys.argv[2:]]; import psycopg; "
            "conn = psycopg.connect(sys.argv[1]); conn.execute('SELECT 1'); "
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS:')) / 1024)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, admin, *STACK], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _names(value: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in names if v not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {','.join(allowed)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="small counts: about a minute with every system")
    ap.add_argument("--only", type=lambda v: _names(v, list(SCENARIOS), "scenarios"), help=",".join(SCENARIOS))
    ap.add_argument("--systems", type=lambda v: _names(v, SYSTEMS, "systems"), help=",".join(SYSTEMS))
    args = ap.parse_args(argv)
    systems = [s for s in SYSTEMS if s in (args.systems or SYSTEMS)]  # Jobdeck first in the table
    try:
        result = run(args.quick, args.rounds, args.only, systems, log=lambda m: print(m, flush=True))
    except RuntimeError as exc:  # no PostgreSQL, no Python 3.12 for oban-py
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = REPO / "bench" / "results" / f"pg-bench-{result['mode']}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print()
    print(table(result))
    print(f"\nJSON: {out}  ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
