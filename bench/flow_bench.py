"""Scenario 8: the cost of flow limits. Drain ``n`` no-op jobs spread over
``keys`` keys with a concurrency of 1 per key and a type-wide rate limit
generous enough not to bind much, against the unlimited drain of the same
jobs in the same run; on SQLite and, with ``database_url``, PostgreSQL.
The limited drain should keep at least half the unlimited one's rate.

What bounds it: a concurrency of one per key holds at most ``keys`` jobs at
once (claimed or running), so a transaction completes and claims at most
100 jobs where the unlimited pool moves a batch of 250; where a commit is
dear (SQLite FULL: an fsync) that caps the limited drain at 100 jobs per
commit. Run both ``--synchronous`` values and PostgreSQL to see it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import NOOP, Counter, make_deck
from bench.jobdeck_bench import timed_drain

FLOW = {"concurrency": 1, "concurrency_key": "payload.k", "rate": "100000/1s"}


def drain_keyed(
    workdir: Path, n: int, limited: bool, keys: int = 100, threads: int = 4, synchronous: str = "FULL", **overrides: Any
) -> float:
    """jobs/s draining ``n`` jobs of ``keys`` keys, with the flow limits or without."""
    counter = Counter(n)
    if limited:
        overrides["types"] = {NOOP: dict(FLOW)}
    deck = make_deck(workdir / "flow.db", synchronous, threads, handler=lambda p, c: counter.hit(), **overrides)
    try:
        if deck.store.dialect == "postgresql":
            empty_postgres(deck)
        for start in range(0, n, 5000):
            deck.enqueue_many([{"type": NOOP, "payload": {"k": i % keys}} for i in range(start, min(n, start + 5000))])
        if deck.store.dialect == "postgresql":
            analyze(deck)
        return timed_drain(deck, counter, n, threads, max(120.0, n / 100), "flow drain")
    finally:
        deck.store.engine.dispose()


def empty_postgres(deck: Any) -> None:
    from sqlalchemy import text

    with deck.store.write() as conn:
        conn.execute(text("TRUNCATE jobs, attempts, flow_starts, flow_closed, stats_minutely CASCADE"))


def analyze(deck: Any) -> None:
    """The local PostgreSQL has autovacuum off and TRUNCATE drops statistics."""
    with deck.store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE jobs")


def compare(workdir: Path, n: int, runs: int = 1, **overrides: Any) -> dict[str, Any]:
    """Both drains, alternated ``runs`` times; the medians and their ratio."""
    plain, flow = [], []
    for _ in range(runs):
        plain.append(drain_keyed(workdir, n, False, **overrides))
        flow.append(drain_keyed(workdir, n, True, **overrides))
    a, b = sorted(plain)[len(plain) // 2], sorted(flow)[len(flow) // 2]
    return {"jobs": n, "unlimited": a, "limited": b, "kept": b / a, "runs_unlimited": plain, "runs_limited": flow}


if __name__ == "__main__":
    import argparse
    import json
    import sys
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--database-url", default=None, help="postgresql+psycopg://... to drain on PostgreSQL")
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"], help="SQLite's")
    args = ap.parse_args()
    extra: dict[str, Any] = {"synchronous": args.synchronous}
    if args.database_url:
        extra["database_url"] = args.database_url
    with tempfile.TemporaryDirectory(prefix="jobdeck-flow-") as tmp:
        print(json.dumps(compare(Path(tmp), args.jobs, args.runs, **extra)))
    sys.exit(0)
