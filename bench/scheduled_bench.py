"""Jobs scheduled for later: what a deployment holding many of them costs.

Usage: ``python3 -m bench.scheduled_bench [--scheduled 200000] [--rate 50]
[--seconds 10] [--rounds 3]``

Each round starts a real ``jobdeck worker --demo`` (as ``bench.shipped_bench``
starts it: its defaults, SQLite FULL) twice, each on a fresh file: beside no
other job (the control), and beside ``--scheduled`` jobs due in an hour
(``deck.enqueue_many`` before the start, spread over three priorities). Once
the worker is ready and has settled, this process enqueues ``demo.noop`` jobs
one at a time at ``--rate`` a second for ``--seconds`` (another process's
commits: the worker learns of them through its commit watcher, as from an
HTTP server). Measured: the worker's CPU over the window (every process of its
tree, from ``/proc``) as a share of one core, and each trickled job's wait
from its enqueue to its start (the database's own timestamps). Every trickled
job must have run. The order of the two rotates each round.

Beside it, in this process: one claim with nothing due, beside the same
scheduled jobs and beside none, on SQLite (and PostgreSQL with
``--database-url``): the claim's own cost, median of 30.

Before the claim named the priorities it reads (``claim_statements.PRIORITIES``),
every claim and every probe of the commit watcher walked the claim index
through all the scheduled jobs when fewer than its limit were due.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, make_deck, percentile  # noqa: E402
from bench.idle_bench import _cpu_seconds, _ready, _tree  # noqa: E402
from bench.serve_bench import stop  # noqa: E402
from bench.shipped_bench import _engine, command  # noqa: E402

SETTLE = 2.0
"""Seconds between ready and the trickle: start-up's own work left out."""


def _deck(url: str, work: Path) -> Any:
    deck = make_deck(work / "scheduled.db", "FULL", 0, database_url=url)
    deck.registry.handler("demo.noop", max_retries=0)(lambda payload, ctx: None)
    return deck


def schedule(deck: Any, n: int) -> None:
    """``n`` jobs due in an hour, over three priorities, as a user would enqueue them."""
    for start in range(0, n, 5000):
        deck.enqueue_many(
            [
                {"type": "demo.noop", "delay_seconds": 3600, "priority": (0, 10, -10)[i % 3]}
                for i in range(min(5000, n - start))
            ]
        )


def trickle(scheduled: int, rate: float, seconds: float, work: Path) -> dict[str, Any]:
    """One worker beside ``scheduled`` jobs, given ``rate`` jobs a second for ``seconds``."""
    folder = Path(tempfile.mkdtemp(prefix=f"scheduled-{scheduled}-", dir=work))
    url = f"sqlite:///{folder / 'jobdeck.db'}"
    deck = _deck(url, folder)
    try:
        schedule(deck, scheduled)
        argv, env = command("worker", url, folder)
        with open(folder / "out.log", "wb") as out:
            proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=out)
        try:
            _ready("worker", argv, url, proc, time.monotonic() + 60)
            time.sleep(SETTLE)  # start-up's own work left out of the measurement
            pids = _tree(proc.pid)
            cpu, t0 = _cpu_seconds(pids), time.monotonic()
            sent: list[int] = []
            for i in range(int(rate * seconds)):
                time.sleep(max(0.0, t0 + i / rate - time.monotonic()))  # the trickle's pace
                job, _ = deck.enqueue("demo.noop")
                sent.append(job.id)
            share = 100 * (_cpu_seconds(pids) - cpu) / (time.monotonic() - t0)
            waits = _waits(url, sent, time.monotonic() + 60)
        finally:
            stop(proc)
    finally:
        deck.store.engine.dispose()
    return {"cpu_share": share, "p50_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99), "jobs": len(sent)}


def _waits(url: str, ids: list[int], deadline: float) -> list[float]:
    """Each job's wait from its enqueue to its first start (ms), once every one has run."""
    from sqlalchemy import bindparam, text

    engine = _engine(url)
    query = text(
        "SELECT j.created_at, min(a.started_at) FROM jobs j JOIN attempts a ON a.job_id = j.id "
        "WHERE j.id IN :ids AND j.status = 'completed' GROUP BY j.id"  # the demo's schedules enqueue beside them
    ).bindparams(bindparam("ids", expanding=True))
    try:
        while True:
            with engine.connect() as conn:
                rows = conn.execute(query, {"ids": ids}).all()
            if len(rows) == len(ids):
                return [1000 * (_utc(started) - _utc(created)).total_seconds() for created, started in rows]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids) - len(rows)} of the trickled jobs did not run")
            time.sleep(0.2)  # polling for the last completions, under the deadline
    finally:
        engine.dispose()


def _utc(value: Any) -> datetime:
    value = datetime.fromisoformat(value) if isinstance(value, str) else value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def claim_cost(url: str, scheduled: int, work: Path) -> float:
    """The median time (ms) of a claim of up to 250 jobs that finds none due, beside ``scheduled`` jobs."""
    deck = _deck(url, work)
    try:
        if deck.store.dialect == "postgresql":
            from bench.flow_bench import analyze, empty_postgres

            empty_postgres(deck)
            schedule(deck, scheduled)
            analyze(deck)
        else:
            schedule(deck, scheduled)
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            if deck.store.claim("bench", deck.clock(), limit=250):
                raise RuntimeError("a scheduled job was claimed")
            times.append(1000 * (time.perf_counter() - t0))
        return statistics.median(times)
    finally:
        deck.store.engine.dispose()


def run(scheduled: int, rate: float, seconds: float, rounds: int, database_url: str | None) -> dict[str, Any]:
    sizes = [0, scheduled]
    per: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    claims: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="jobdeck-scheduled-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for n in sizes if i % 2 == 0 else sizes[::-1]:
                got = trickle(n, rate, seconds, work)
                per[n].append(got)
                print(f"  round {i + 1}: beside {n:,} scheduled: {got['cpu_share']:.1f}% of a core, "
                      f"wait p50 {got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms", flush=True)  # fmt: skip
        urls = {"sqlite": None, **({"postgresql": database_url} if database_url else {})}
        for name, url in urls.items():
            claims[name] = {}
            for n in sizes:
                folder = Path(tempfile.mkdtemp(prefix="claim-", dir=work))
                claims[name][n] = claim_cost(url or f"sqlite:///{folder / 'claim.db'}", n, folder)
                print(
                    f"  {name}: a claim with nothing due beside {n:,} scheduled: {claims[name][n]:.2f} ms", flush=True
                )
    medians = {
        n: {k: statistics.median(r[k] for r in rows) for k in ("cpu_share", "p50_ms", "p99_ms")}
        for n, rows in per.items()
    }
    return {"scheduled": scheduled, "rate": rate, "seconds": seconds, "rounds": per, "medians": medians,
            "claims": claims, "machine": machine()}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    n, rate = result["scheduled"], result["rate"]
    lines = [
        f"| `jobdeck worker --demo`, SQLite FULL, {rate:g} enqueues/s from another process | CPU, share of one core "
        "| wait to start, p50 | p99 |",
        "|---|---|---|---|",
    ]
    for size, m in result["medians"].items():
        lines.append(f"| beside {size:,} jobs scheduled for later | {m['cpu_share']:.1f}% | {m['p50_ms']:.1f} ms "
                     f"| {m['p99_ms']:.1f} ms |")  # fmt: skip
    lines += [
        "",
        f"| a claim of up to 250 with nothing due (median of 30) | beside none | beside {n:,} |",
        "|---|---|---|",
    ]
    for name, by in result["claims"].items():
        lines.append(f"| {name} | {by[0]:.2f} ms | {by[n]:.2f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheduled", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=None, help="also time the claim on this PostgreSQL database")
    args = parser.parse_args(argv)
    result = run(args.scheduled, args.rate, args.seconds, args.rounds, args.database_url)
    print(table(result))
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
