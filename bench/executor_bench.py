"""Scenario 12: the executors against the peers that run the same kind of
job, each figure from a fresh process, the systems interleaved in rounds.

Usage: ``python3 -m bench.executor_bench [--quick] [--rounds N]
[--only async,process] [--no-peers]``.

- ``async``: drain pre-enqueued ``async def`` no-op jobs with one consumer
  process. Jobdeck on PostgreSQL (what ``jobdeck worker`` runs, 4 threads,
  the handler on the pool's event loop, ``async_concurrency`` 100),
  Procrastinate's async worker (concurrency 100) and PgQueuer (uvloop,
  ``batch_size=250``), measured by ``bench/peers/pg_harness.py`` as scenario
  10 measures them; arq (``max_jobs=100``, burst mode) and SAQ
  (``concurrency=100``) on the local Redis (``bench/peers/exec_peers.py``).
- ``process``: what running a job in a child process costs over running
  it in the worker, per job, on the same no-op, 2 slots each: Jobdeck's
  thread executor against its process executor (``workers = 2``,
  ``process_workers = 2``, SQLite FULL), Celery's thread pool against its
  prefork pool (``-c 2``, Redis broker), RQ's ``SimpleWorker`` against its
  ``Worker`` that forks a work-horse per job (2 worker processes). Each
  drain runs ``WARM`` jobs first (the children's start), then is timed over
  the next ``n`` completions.

Each round runs every system once, in an order rotated by the round;
ratios are taken within a round, then their median is reported. The peers
are installed on first use: Procrastinate into ``bench/.venv``, PgQueuer
into ``bench/.venv-pgqueuer`` (``bench/pg_bench.py``), arq, SAQ, Celery and RQ
into ``bench/.venv-exec`` (``EXEC_PINS``). A peer that does not install
is left out with a note; the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import pg_bench  # noqa: E402
from bench.common import NOOP, REPO, machine, make_deck  # noqa: E402

EXEC_VENV = REPO / "bench" / ".venv-exec"
EXEC_PINS = ["celery[redis]==5.6.0", "arq==0.28.0", "saq==0.26.4", "rq==3.0.0", "redis==5.3.1"]
PEERS_DIR = REPO / "bench" / "peers"
WARM = 50
FULL = {"async": 10_000, "jobdeck": 5_000, "celery": 2_000, "rq": 500, "rounds": 3}
QUICK = {"async": 2_000, "jobdeck": 1_000, "celery": 500, "rq": 100, "rounds": 1}
TINY = {"async": 200, "jobdeck": 500, "celery": 100, "rq": 20, "rounds": 1}
ASYNC = ("jobdeck", "procrastinate", "pgqueuer", "arq", "saq")
PAIRS = {"jobdeck": ("thread", "process"), "celery": ("celery-threads", "celery-prefork"),
         "rq": ("rq-simple", "rq-fork")}  # fmt: skip
LABELS = {"jobdeck": "Jobdeck", "procrastinate": "Procrastinate", "pgqueuer": "PgQueuer", "arq": "arq", "saq": "SAQ",
          "celery": "Celery", "rq": "RQ"}  # fmt: skip
HOW = {"jobdeck": "thread executor / process executor, 2 slots, SQLite FULL",
       "celery": "threads pool / prefork pool, `-c 2`, Redis broker",
       "rq": "`SimpleWorker` / `Worker` (a fork per job), 2 workers, Redis"}  # fmt: skip


def noop(payload: dict[str, Any], ctx: Any) -> None:
    """The no-op, importable by name by the process executor's children."""


# -- one measurement, in a fresh process -----------------------------------------


def jobdeck_exec(executor: str, n: int, workdir: Path) -> dict[str, float]:
    """jobs/s of a pool with 2 slots draining ``n`` no-op jobs on ``executor``
    ("thread" or "process"), after ``WARM`` jobs; counted in the database
    by a connection of its own (what the peers' counter is for them)."""
    from jobdeck.core.states import State
    from jobdeck.runtime import pool_for

    overrides: dict[str, Any] = {"process_workers": 2, "handler_modules": ["bench.executor_bench"]}
    if executor == "process":
        overrides["types"] = {NOOP: {"executor": "process"}}
    path = workdir / f"exec-{executor}.db"
    deck = make_deck(path, "FULL", 2, handler=noop, **overrides)
    watch = sqlite3.connect(path)
    count = "SELECT count(*) FROM jobs WHERE status = ?"

    def done() -> int:
        return int(watch.execute(count, (State.COMPLETED.value,)).fetchone()[0])

    try:
        for start in range(0, WARM + n, 5000):
            deck.enqueue_many([{"type": NOOP} for _ in range(min(5000, WARM + n - start))])
        pool = pool_for(deck, 2)
        deadline = time.monotonic() + 60 + n / 50
        pool.start()
        try:
            while (c0 := done()) < WARM:
                _before(deadline, c0)
                time.sleep(0.005)
            t0 = time.perf_counter()
            while (last := done()) < WARM + n:
                _before(deadline, last)
                time.sleep(0.005)
            elapsed = time.perf_counter() - t0
        finally:
            pool.stop(grace=5)
        if last == c0:
            raise RuntimeError(f"every job had completed by the end of the warm-up ({last}): too few jobs")
        return {"rate": (last - c0) / elapsed, "seconds": elapsed}
    finally:
        watch.close()
        deck.store.engine.dispose()


def _before(deadline: float, done: int) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"stalled at {done} completed")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    try:
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {out.returncode}", "stderr": out.stderr[-3000:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(system: str, python: Path | None, n: int) -> dict[str, Any]:
    """One figure of ``system`` (an async system, or one side of a pair)."""
    if system in ("thread", "process"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env["PYTHONPATH"] = str(REPO)
        return _run([sys.executable, "-m", "bench.executor_bench", "--measure", system, str(n)], REPO, env)
    if system in ("jobdeck", "procrastinate", "pgqueuer"):
        return pg_bench.measure(system, python, "drain1", n, BENCH_JOBDECK_ASYNC="1")
    assert python is not None
    return _run([str(python), "exec_peers.py", system, str(n)], PEERS_DIR)


# -- the peers' interpreters -------------------------------------------------------


def exec_python() -> Path:
    """``bench/.venv-exec`` with ``EXEC_PINS`` (arq, Celery, RQ), made on first use."""
    python = EXEC_VENV / "bin" / "python"
    if not python.exists():
        venv.create(EXEC_VENV, with_pip=True)
    if not pg_bench._pinned(python, EXEC_PINS):
        subprocess.run([python, "-m", "pip", "install", "-q", *EXEC_PINS], check=True)
    return python


def interpreters(systems: list[str], log: Callable[[str], None]) -> dict[str, Path | None]:
    """Each system's interpreter; a peer that does not install is left out."""
    found: dict[str, Path | None] = {}
    for system in systems:
        try:
            if system in ("jobdeck", "thread", "process"):
                found[system] = None
            elif system in ("procrastinate", "pgqueuer"):
                found[system] = pg_bench.peer_python(system)
            else:
                found[system] = exec_python()
        except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
            log(f"  {system} left out: it did not install ({exc})")
    return found


def versions(python: Path, names: list[str]) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True)
    return dict(json.loads(out.stdout)) if out.returncode == 0 else {}


# -- rounds -------------------------------------------------------------------------


def _show(run: dict[str, Any]) -> str:
    return f"error: {run['error']}" if "error" in run else f"{run['rate']:,.0f} jobs/s"


def async_rounds(n: int, rounds: int, peers: bool, log: Callable[[str], None]) -> dict[str, Any]:
    pg_bench.check_postgres()
    if peers:
        from bench.run import ensure_redis

        ensure_redis()
    pythons = interpreters(list(ASYNC if peers else ASYNC[:1]), log)
    systems = [s for s in ASYNC if s in pythons]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for r in range(rounds):
        for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
            runs[system].append(measure(system, pythons[system], n))
            log(f"  async round {r + 1}/{rounds} {LABELS[system]:<13} {_show(runs[system][-1])}")
    summary = pg_bench.summarize({"drain1": runs})
    return {"systems": systems, "runs": runs, "rate": summary["drain1:rate"],
            "consumer_cpu_us": summary["drain1:consumer_cpu_us"]}  # fmt: skip


def process_rounds(counts: dict[str, int], rounds: int, peers: bool, log: Callable[[str], None]) -> dict[str, Any]:
    if peers:
        from bench.run import ensure_redis

        ensure_redis()
    pythons = interpreters([side for name in PAIRS if peers or name == "jobdeck" for side in PAIRS[name]], log)
    names = [name for name, sides in PAIRS.items() if all(side in pythons for side in sides)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {"in": [], "process": []} for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            sides = list(zip(("in", "process"), PAIRS[name], strict=True))
            for key, side in sides if r % 2 == 0 else sides[::-1]:
                runs[name][key].append(measure(side, pythons[side], counts[name]))
                log(f"  process round {r + 1}/{rounds} {LABELS[name]:<8} {side:<15} {_show(runs[name][key][-1])}")
    return {"systems": names, "runs": runs, "summary": overheads(runs)}


def overheads(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per system: median jobs/s and ms per job of each side, the process
    side's extra ms per job (per round, then the median); for a peer, its
    extra over Jobdeck's (where its median extra is above 0) and Jobdeck's child-process
    rate over its own, each taken within a round, then the median."""
    extra: dict[str, list[float | None]] = {}
    out: dict[str, Any] = {}
    for name, sides in runs.items():
        extra[name] = [1000 / p["rate"] - 1000 / i["rate"] if "rate" in i and "rate" in p else None
                       for i, p in zip(sides["in"], sides["process"], strict=True)]  # fmt: skip
        row: dict[str, Any] = {}
        for key in ("in", "process"):
            rates = [v["rate"] for v in sides[key] if "rate" in v]
            row[key] = statistics.median(rates) if rates else None
            row[f"{key}_ms"] = 1000 / row[key] if row[key] else None
            row[key] = row[key] or None
        good = [e for e in extra[name] if e is not None]
        row["extra_ms"] = statistics.median(good) if good else None
        row["errors"] = sum("error" in v for side in sides.values() for v in side)
        out[name] = row
    for name, row in out.items():
        pairs = [(j, p) for j, p in zip(extra.get("jobdeck", []), extra[name], strict=False)
                 if j is not None and p is not None and j > 0]  # fmt: skip
        positive = row["extra_ms"] is not None and row["extra_ms"] > 0  # else "extra" is no cost to compare
        row["vs_jobdeck"] = (
            statistics.median([p / j for j, p in pairs]) if pairs and positive and name != "jobdeck" else None
        )
        rates = [(j["rate"], p["rate"]) for j, p in zip(runs.get("jobdeck", {}).get("process", []),
                                                        runs[name]["process"], strict=False) if "rate" in j and "rate" in p]  # fmt: skip
        row["child_ratio"] = statistics.median([j / p for j, p in rates]) if rates and name != "jobdeck" else None
    return out


# -- the tables ---------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    lines: list[str] = []
    c = result["counts"]
    if "async" in result:
        a = result["async"]
        lines += [f"| drain {c['async']:,} async no-op jobs, 1 consumer process | "
                  + " | ".join(LABELS[s] for s in a["systems"]) + " |", "|---|" + "---|" * len(a["systems"])]  # fmt: skip
        for key, what in (("rate", "jobs/s"), ("consumer_cpu_us", "consumer CPU per job (µs)")):
            cells = []
            for s in a["systems"]:
                value, ratio = a[key]["median"].get(s), a[key]["ratio"].get(s)
                cell = "–" if value is None else f"{value:,.0f}"
                cell += f" ({ratio:.2f}x)" if ratio is not None else ""
                cell += f" [{a[key]['errors'][s]} failed]" if a[key]["errors"].get(s) else ""
                cells.append(cell)
            lines.append(f"| {what} | {' | '.join(cells)} |")
        lines.append("")
    if "process" in result:
        p = result["process"]["summary"]
        lines += ["| 2 slots, the same no-op | in the worker | in a child process | extra per job | "
                  "extra / Jobdeck's | child process, Jobdeck / this |", "|---|---|---|---|---|---|"]  # fmt: skip
        for name, row in p.items():
            n = c[name]

            def cell(key: str, row: dict[str, Any] = row) -> str:
                return "–" if row[key] is None else f"{row[key]:,.0f} jobs/s ({row[f'{key}_ms']:.2f} ms)"

            extra = "–" if row["extra_ms"] is None else f"{row['extra_ms']:.2f} ms"
            vs = "–" if row["vs_jobdeck"] is None else f"{row['vs_jobdeck']:.1f}x"
            child = "–" if row["child_ratio"] is None else f"{row['child_ratio']:.2f}x"
            failed = f" [{row['errors']} failed]" if row["errors"] else ""
            lines.append(f"| {LABELS[name]}: {HOW[name]}, {n:,} jobs | {cell('in')} | {cell('process')} | "
                         f"{extra}{failed} | {vs} | {child} |")  # fmt: skip
        lines.append("")
    m = result["machine"]
    lines.append(f"Median of {result['rounds']} interleaved rounds; (x): Jobdeck's ratio to that peer within each "
                 f"round, then the median (above 1: Jobdeck ahead). Machine: {m['cores']} cores, Python "
                 f"{m['python']}, load at start {m['loadavg_at_start']}.")  # fmt: skip
    return "\n".join(lines)


def run(counts: dict[str, int], parts: set[str], peers: bool = True, rounds: int | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    rounds = rounds or counts["rounds"]
    result: dict[str, Any] = {"machine": machine(), "counts": counts, "rounds": rounds,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    t0 = time.monotonic()
    if "async" in parts:
        try:
            result["async"] = async_rounds(counts["async"], rounds, peers, log)
        except RuntimeError as exc:  # no PostgreSQL here
            log(f"  async drain skipped: {exc}")
    if "process" in parts:
        result["process"] = process_rounds(counts, rounds, peers, log)
    if peers and EXEC_VENV.exists():
        result["versions"] = versions(EXEC_VENV / "bin" / "python", ["arq", "saq", "celery", "rq", "redis"])
    result["seconds"] = time.monotonic() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, 1 round: a minute or two")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick 1)")
    ap.add_argument("--only", default="async,process", help="async, process, or both")
    ap.add_argument("--no-peers", action="store_true", help="Jobdeck's figures alone")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the smoke test
    ap.add_argument("--measure", nargs=2, metavar=("EXECUTOR", "N"), help=argparse.SUPPRESS)  # one Jobdeck figure
    args = ap.parse_args(argv)
    if args.measure:  # by its module's name: the children import the handler from there, not from __main__
        from bench.executor_bench import jobdeck_exec as by_name

        with tempfile.TemporaryDirectory(prefix="jobdeck-exec-") as tmp:
            print(json.dumps(by_name(args.measure[0], int(args.measure[1]), Path(tmp))), flush=True)
        return 0
    counts = dict(TINY if args.tiny else QUICK if args.quick else FULL)
    result = run(counts, set(args.only.split(",")), not args.no_peers, args.rounds, lambda m: print(m, flush=True))
    if not args.tiny:
        out = REPO / "bench" / "results" / f"executors-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))
        print(f"\nJSON: {out}  ({result['seconds']:.0f} s)")
    print()
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
