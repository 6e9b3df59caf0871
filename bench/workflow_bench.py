"""Scenario 9: the cost of workflows. Drain ``workflows`` two-step workflows
(A -> B: B is blocked until A completes, and A's completion promotes it in
its own transaction) with the embedded worker pool, against the plain drain
of ``plain`` independent no-op jobs in the same run, on the same machine;
on SQLite and, with ``JOBDECK_BENCH_POSTGRES_URL`` (or
``--database-url``), PostgreSQL. Each figure is the median of ``runs``
rounds, the two drains alternated. Enqueue is not timed.

What it costs: a completion that frees a dependent counts the dependent's
``deps_left`` down and promotes it in the acknowledging transaction (on
PostgreSQL after locking its row), and the workflow's second half can only
be claimed after its first half's acknowledgement committed, so the pool
waits for work more often than on a queue where every job is due at once.

Usage: ``python3 -m bench.workflow_bench [--workflows 10000] [--plain 20000]
[--runs 3] [--database-url postgresql+psycopg://...] [--synchronous FULL]``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import NOOP, Counter, machine, make_deck, median
from bench.jobdeck_bench import pool_maker

CHUNK = 1000
"""Workflows (or plain jobs) per enqueue call: the fill is quick and not timed."""


def _fill_workflows(deck: Any, n: int) -> None:
    from jobdeck.jobs.workflows import parse_workflow

    steps = [{"name": "a", "type": NOOP}, {"name": "b", "type": NOOP, "depends_on": ["a"]}]
    for start in range(0, n, CHUNK):
        news = [parse_workflow(deck, {"name": "bench", "jobs": steps}) for _ in range(min(CHUNK, n - start))]
        deck.store.enqueue_workflows(news, deck.clock())


def _fill_plain(deck: Any, n: int) -> None:
    for start in range(0, n, CHUNK * 5):
        deck.enqueue_many([{"type": NOOP} for _ in range(min(CHUNK * 5, n - start))])


def _analyze(deck: Any) -> None:
    """The local PostgreSQL runs with autovacuum off: plan on fresh statistics."""
    with deck.store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")


def _drain(
    workdir: Path, jobs: int, fill: Callable[[Any], None], threads: int, synchronous: str, **overrides: Any
) -> float:
    """jobs/s from pool start until all ``jobs`` completions are committed."""
    counter = Counter(jobs)
    deck = make_deck(workdir / "workflow.db", synchronous, threads, handler=lambda p, c: counter.hit(), **overrides)
    try:
        fill(deck)
        if deck.store.dialect == "postgresql":
            _analyze(deck)
        pool = pool_maker()(deck, threads)
        t0 = time.perf_counter()
        pool.start()
        if not counter.done.wait(timeout=max(120.0, jobs / 100)):
            raise RuntimeError(f"drain stalled at {counter.n}/{jobs}")
        while pool.inflight:
            time.sleep(0.001)  # acks still being committed
        elapsed = time.perf_counter() - t0
        pool.stop(grace=5)
        done = int(deck.store.counts(deck.clock())["completed"])
        if done != jobs:
            raise RuntimeError(f"drain: {done} completed, expected {jobs}")
        return jobs / elapsed
    finally:
        deck.store.engine.dispose()


def drain_workflows(workdir: Path, n: int, threads: int = 4, synchronous: str = "FULL", **overrides: Any) -> float:
    """jobs/s draining ``n`` A -> B workflows (``2 n`` jobs)."""
    return _drain(workdir, 2 * n, lambda deck: _fill_workflows(deck, n), threads, synchronous, **overrides)


def drain_plain(workdir: Path, n: int, threads: int = 4, synchronous: str = "FULL", **overrides: Any) -> float:
    """jobs/s draining ``n`` independent no-op jobs."""
    return _drain(workdir, n, lambda deck: _fill_plain(deck, n), threads, synchronous, **overrides)


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A fresh schema on ``url`` for one drain (the deck migrates it), dropped after."""
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
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def compare(
    workdir: Path,
    workflows: int = 10_000,
    plain: int = 20_000,
    runs: int = 3,
    database_url: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Both drains, alternated ``runs`` times on one database; the medians
    and the workflows' rate as a share of the plain one."""
    rates: dict[str, list[float]] = {"plain": [], "workflows": []}
    for _ in range(runs):
        for kind, drain, n in (("plain", drain_plain, plain), ("workflows", drain_workflows, workflows)):
            if database_url is None:
                rates[kind].append(drain(workdir, n, **overrides))
                continue
            with postgres_schema(database_url) as scoped:
                rates[kind].append(drain(workdir, n, database_url=scoped, **overrides))
    a, b = median(rates["plain"]), median(rates["workflows"])
    return {
        "backend": "postgresql" if database_url else "sqlite",
        "plain_jobs": plain,
        "workflows": workflows,
        "workflow_jobs": 2 * workflows,
        "plain": a,
        "workflow": b,
        "ratio": b / a,
        "runs_plain": rates["plain"],
        "runs_workflow": rates["workflows"],
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | plain drain (jobs/s) | A -> B workflows drain (jobs/s) | workflows / plain |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['backend']} | {r['plain']:,.0f} ({r['plain_jobs']:,} jobs) | {r['workflow']:,.0f} "
            f"({r['workflows']:,} workflows, {r['workflow_jobs']:,} jobs) | {r['ratio']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflows", type=int, default=10_000)
    ap.add_argument("--plain", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"], help="SQLite's")
    ap.add_argument("--database-url", default=os.environ.get("JOBDECK_BENCH_POSTGRES_URL"),
                    help="postgresql+psycopg://... (default $JOBDECK_BENCH_POSTGRES_URL); SQLite only without it")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the figures as JSON after the table")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="jobdeck-workflow-") as tmp:
        options = {"threads": args.threads, "synchronous": args.synchronous}
        for url in (None, args.database_url) if args.database_url else (None,):
            results.append(compare(Path(tmp), args.workflows, args.plain, args.runs, url, **options))
            print(f"  {results[-1]['backend']}: done", flush=True)
    print()
    print(table(results))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
