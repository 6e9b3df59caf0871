"""Where the PostgreSQL server's time goes in a drain, statement by statement.

Usage: ``python3 -m bench.pg_statements [--jobs 20000] [--batch 250] [--rounds 5]``.

It fills Jobdeck's benchmark database (``bench/pg_jobdeck.py``) with
``--jobs`` no-op jobs, runs ``VACUUM ANALYZE``, then drains it the way one
pool's batch does: the claim of ``--batch`` jobs (autocommit, as the
fetcher runs it), then their completion with their attempt rows (one
statement in autocommit, as the acker writes them). Each statement is the
store's own (``jobdeck.store.statements``), compiled as the store compiles it,
and runs under ``EXPLAIN (ANALYZE, BUFFERS)``, so it does its real work;
its WAL is read from the log with ``pg_walinspect`` (the plan's counters
miss a CTE that no node reads from, and row locks). Printed per job, the
median over ``--rounds`` batches: the server's execution time, the time in
triggers (the attempts' foreign key), and WAL records and bytes. ``drain``
in ``bench/pg_bench.py`` measures the same work end to end (CPU per job of
the consumers and of the server).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import NOOP  # noqa: E402
from bench.peers import pg_harness  # noqa: E402
from bench.pg_jobdeck import Jobdeck  # noqa: E402

WORKER = "bench-worker"


def _walinspect(conn: Any) -> str:
    """The schema ``pg_walinspect`` is in, created in ``public`` if it is
    not there. An extension is one per database, whatever the search path: made
    without a schema, it went into the first schema on the path, a test's own,
    and another run on the same database (CI's quick tiers) then found it
    "existing" but off its path, or dropped with that schema. ``conn`` is in
    autocommit."""
    import psycopg

    with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect WITH SCHEMA public")  # or another session did
    (schema,) = conn.execute(
        "SELECT quote_ident(n.nspname) FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_walinspect'"
    ).fetchone()
    return str(schema)


def _explain(conn: Any, text: str, params: tuple[Any, ...]) -> dict[str, float]:
    """Run ``text`` under EXPLAIN ANALYZE; its WAL is read from the log
    itself (``pg_walinspect``): a plan's WAL counters miss the work of a
    data-modifying CTE that no node reads from."""
    walinspect = _walinspect(conn)
    start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params).fetchall())
    # The statement committed, so its WAL is flushed; the insert position may
    # already be past what is flushed (other sessions), which the reader refuses.
    end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    records, size = conn.execute(
        f"SELECT count(*), coalesce(sum(record_length), 0) FROM {walinspect}.pg_get_wal_records_info(%s, %s)"
        " WHERE resource_manager NOT IN ('Transaction', 'XLOG', 'Standby')",  # not the commit, nor the background's
        (start, end),
    ).fetchone()
    triggers = sum(float(t) for t in re.findall(r"Trigger for .*?: time=([\d.]+)", plan))
    rows = re.search(r"actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", plan.splitlines()[0])
    return {
        "ms": float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1)),  # type: ignore[union-attr]
        "trigger_ms": triggers,
        "wal_records": float(records),
        "wal_bytes": float(size),
        "rows": float(rows.group(1)) if rows else 0.0,
    }


def profile(jobs: int, batch: int, rounds: int) -> dict[str, dict[str, float]]:
    import psycopg
    from jobdeck.store import attempt_statements, claim_statements

    system = Jobdeck()
    system.install()
    try:
        system.deck.enqueue_many([{"type": NOOP} for _ in range(jobs)])
        pg_harness.vacuum_analyze(system.dsn)
    finally:
        system.close()
    claim = claim_statements.claim(1, None, 0)
    complete = attempt_statements.complete_recorded(False, alone=True)
    per_round: dict[str, list[dict[str, float]]] = {"claim": [], "completion and attempt rows": []}
    with psycopg.connect(system.dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        for _ in range(rounds + 1):  # the first batch warms the caches and is not counted
            now = datetime.now(UTC)
            text = claim.postgres.text
            got = _explain(conn, text, claim.postgres.params((WORKER, now, NOOP, batch)))
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM jobs WHERE worker_id = %s AND status = 'running' ORDER BY id", (WORKER,)
            ).fetchall()]  # fmt: skip
            n = len(ids)
            if n == 0:
                raise RuntimeError("no jobs left to claim: raise --jobs")
            values = tuple(complete.params((now, WORKER, ids, [1] * n, [now] * n, "thread")).values())
            done = _explain(conn, complete.postgres.text, complete.postgres.params(values))
            for name, figures in (("claim", got), ("completion and attempt rows", done)):
                per_round[name].append({k: v / n for k, v in figures.items() if k != "rows"} | {"jobs": n})
    return {name: {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]} for name, runs in per_round.items()}


def table(result: dict[str, dict[str, float]]) -> str:
    lines = [
        "| statement (per job) | server time (µs) | of it in triggers (µs) | WAL records | WAL bytes |",
        "|---|---|---|---|---|",
    ]
    total = {k: 0.0 for k in ("ms", "trigger_ms", "wal_records", "wal_bytes")}
    for name, f in result.items():
        for k in total:
            total[k] += f[k]
        lines.append(f"| {name} | {f['ms'] * 1000:.1f} | {f['trigger_ms'] * 1000:.1f} | "
                     f"{f['wal_records']:.1f} | {f['wal_bytes']:.0f} |")  # fmt: skip
    lines.append(f"| **both** | {total['ms'] * 1000:.1f} | {total['trigger_ms'] * 1000:.1f} | "
                 f"{total['wal_records']:.1f} | {total['wal_bytes']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=250, help="jobs per claim (the default claim_batch)")
    ap.add_argument("--rounds", type=int, default=5, help="batches measured after one warm-up batch")
    args = ap.parse_args(argv)
    if args.jobs < args.batch * (args.rounds + 1):
        ap.error("--jobs must hold (--rounds + 1) batches")
    print(table(profile(args.jobs, args.batch, args.rounds)))
    print(f"\nMedian per job over {args.rounds} batches of {args.batch} on a fresh, analyzed {args.jobs:,}-job table; "
          "execution time as EXPLAIN ANALYZE reports it (no parse, plan, commit or network).")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
