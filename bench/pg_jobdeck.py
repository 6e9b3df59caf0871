"""Jobdeck's adapter for the PostgreSQL scenarios (``bench/peers/pg_harness.py``
measures; ``bench/pg_bench.py`` runs the rounds): the ``app`` of this tree on
its own database, ``bench_pg_jobdeck``, created and migrated afresh for
each measurement.

Its consumer process is what ``jobdeck worker`` runs, the runtime (worker
pool with its LISTEN wake-up, and the scheduler) of a deck with the no-op
handler, ``BENCH_JOBDECK_WORKERS`` threads (default 4, Jobdeck's default
``workers``) and the default ``claim_batch``. With ``BENCH_JOBDECK_ASYNC=1``
the handler is an ``async def`` (the pool's event loop runs it, up to the
default ``async_concurrency``): the executor scenario's async drain.

Usage: ``python3 -m bench.pg_jobdeck drain|enqueue1|enqueue1000|latency N [--procs K]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import NOOP, REPO, make_deck
from bench.peers import pg_harness

DATABASE = "bench_pg_jobdeck"
DSN = f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DATABASE}"
FILL_CHUNK = 5000
WITHOUT = {
    "attempts_fk": ["ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey"],
    "type_index": ["DROP INDEX ix_jobs_type_id"],
    "status_index": ["DROP INDEX ix_jobs_status_id"],
    "attempts_indexes": ["DROP INDEX ix_attempts_job", "DROP INDEX ix_attempts_finished"],
}
"""What a guarantee or a read of the product costs, for the note on the
drain's profile: ``BENCH_JOBDECK_WITHOUT=attempts_fk,type_index`` drops
those from the measured database after its migration. Never the product's
configuration: each is something Jobdeck keeps (the attempts' integrity,
the dashboard's type filter and status lists, a job's history page and the
throughput roll-up)."""


def _deck(workdir: Path, workers: int, handler: Any = None) -> Any:
    return make_deck(workdir / "unused.db", "FULL", workers, handler=handler, database_url=URL)


class Jobdeck:
    dsn = DSN

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="jobdeck-pg-")
        self.deck: Any = None

    def install(self) -> None:
        pg_harness.fresh_database(DATABASE)
        self.deck = _deck(Path(self._tmp.name), 0)  # migrates the new database
        without = [name for name in os.environ.get("BENCH_JOBDECK_WITHOUT", "").split(",") if name]
        if without:
            import psycopg

            with psycopg.connect(DSN, autocommit=True) as conn:
                for name in without:
                    for sql in WITHOUT[name]:
                        conn.execute(sql)

    def fill(self, n: int) -> None:
        for start in range(0, n, FILL_CHUNK):
            self.deck.enqueue_many([{"type": NOOP} for _ in range(min(FILL_CHUNK, n - start))])

    def completed(self, conn: Any) -> int:
        from jobdeck.core.states import State

        return int(conn.execute("SELECT count(*) FROM jobs WHERE status = %s", (State.COMPLETED.value,)).fetchone()[0])

    def consumer(self) -> tuple[list[str], dict[str, str], str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env["PYTHONPATH"] = str(REPO)
        return [sys.executable, "-m", "bench.pg_jobdeck", "consume"], env, str(REPO)

    def enqueue_single(self, n: int) -> float:
        enqueue = self.deck.enqueue
        t0 = time.perf_counter()
        for _ in range(n):
            enqueue(NOOP)
        return time.perf_counter() - t0

    def enqueue_bulk(self, n: int, batch: int) -> float:
        items = [{"type": NOOP} for _ in range(batch)]
        t0 = time.perf_counter()
        for _ in range(n // batch):
            self.deck.enqueue_many(items)
        return time.perf_counter() - t0

    def enqueue_one(self, i: int) -> None:
        self.deck.enqueue(NOOP, {"i": i})

    def close(self) -> None:
        if self.deck is not None:
            self.deck.store.engine.dispose()
        self._tmp.cleanup()


def _noop(payload: dict[str, Any], ctx: Any) -> None:
    pg_harness.report_start(payload.get("i"))


async def _async_noop(payload: dict[str, Any], ctx: Any) -> None:
    pg_harness.report_start(payload.get("i"))


def consume() -> None:
    """One consumer process: the runtime ``jobdeck worker`` starts."""
    from jobdeck.runtime import Runtime

    workers = int(os.environ.get("BENCH_JOBDECK_WORKERS", "4"))
    with tempfile.TemporaryDirectory(prefix="jobdeck-pg-worker-") as tmp:
        deck = _deck(Path(tmp), workers, handler=_async_noop if os.environ.get("BENCH_JOBDECK_ASYNC") == "1" else _noop)
        runtime = Runtime(deck)
        pg_harness.wait_for_go()
        runtime.start()
        threading.Event().wait()  # until terminated


if __name__ == "__main__":
    sys.exit(pg_harness.main(Jobdeck, consume))
