"""The PostgreSQL peers' adapters, each run inside its own virtualenv (see
``bench/pg_bench.py``): ``python pg_peers.py SYSTEM SCENARIO N [--procs K]``
measures once (``pg_harness``) and prints one JSON line;
``python pg_peers.py SYSTEM consume`` is one consumer process.

Each peer has its own database, created afresh and installed by the peer's
own schema API for every measurement, and the same no-op job:

- PgQueuer 1.6.0 (asyncpg, uvloop): a ``QueueManager`` on one connection,
  ``run(batch_size=250)``, the throughput setting of its docs.
- oban-py 0.7.0 (Python 3.12, psycopg pool, uvloop as its CLI runs it):
  ``Oban(queues={"bench": 100})``; migrations by ``oban.schema.install``.
- Procrastinate 3.10.0 (psycopg): ``run_worker(concurrency=100)``, an async task.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pg_harness

HERE = Path(__file__).resolve().parent
HOST = "postgresql://postgres@127.0.0.1:5432"
FILL_CHUNK = 1000


class _Peer:
    """What every peer's adapter shares: its consumer is this script, and its
    completed jobs are counted by ``COMPLETED``."""

    name = ""
    COMPLETED = ""

    def completed(self, conn: Any) -> int:
        return int(conn.execute(self.COMPLETED).fetchone()[0])

    def consumer(self) -> tuple[list[str], dict[str, str], str]:
        return [sys.executable, "pg_peers.py", self.name, "consume"], dict(os.environ), str(HERE)


class _Async(_Peer):
    """A peer whose client is asyncio: one uvloop loop for the adapter's life."""

    def __init__(self) -> None:
        import uvloop

        self.loop = uvloop.new_event_loop()

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    async def one(self, i: int | None) -> None:
        raise NotImplementedError

    async def many(self, count: int) -> None:
        raise NotImplementedError

    def fill(self, n: int) -> None:
        for start in range(0, n, FILL_CHUNK):
            self.run(self.many(min(FILL_CHUNK, n - start)))

    def enqueue_single(self, n: int) -> float:
        async def calls() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                await self.one(None)
            return time.perf_counter() - t0

        return float(self.run(calls()))

    def enqueue_bulk(self, n: int, batch: int) -> float:
        async def calls() -> float:
            t0 = time.perf_counter()
            for _ in range(n // batch):
                await self.many(batch)
            return time.perf_counter() - t0

        return float(self.run(calls()))

    def enqueue_one(self, i: int) -> None:
        self.run(self.one(i))


# -- PgQueuer -----------------------------------------------------------------


class PgQueuer(_Async):
    name = "pgqueuer"
    database = "bench_pg_pgqueuer"
    dsn = f"{HOST}/{database}"
    COMPLETED = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    BATCH_SIZE = 250

    def __init__(self) -> None:
        super().__init__()
        self.conn: Any = None
        self.queries: Any = None

    def install(self) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        pg_harness.fresh_database(self.database)
        self.conn = self.run(asyncpg.connect(self.dsn))
        self.queries = Queries(AsyncpgDriver(self.conn))
        self.run(self.queries.install())

    async def one(self, i: int | None) -> None:
        await self.queries.enqueue("noop", None if i is None else str(i).encode())

    async def many(self, count: int) -> None:
        await self.queries.enqueue(["noop"] * count, [None] * count, [0] * count)

    def close(self) -> None:
        if self.conn is not None:
            self.run(self.conn.close())
        self.loop.close()

    @classmethod
    def consume(cls) -> None:
        import asyncpg
        import uvloop
        from pgqueuer import AsyncpgDriver, Queries, QueueManager

        async def main() -> None:
            conn = await asyncpg.connect(cls.dsn)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("noop")
            async def noop(job: Any) -> None:
                pg_harness.report_start(job.payload.decode() if job.payload else None)

            pg_harness.wait_for_go()
            await qm.run(batch_size=cls.BATCH_SIZE)

        uvloop.run(main())


# -- oban-py --------------------------------------------------------------------


class ObanPy(_Async):
    name = "oban"
    database = "bench_pg_oban"
    dsn = f"{HOST}/{database}"
    COMPLETED = "SELECT count(*) FROM oban_jobs WHERE state = 'completed'"
    LIMIT = 100

    def __init__(self) -> None:
        super().__init__()
        self.pool: Any = None
        self.oban: Any = None

    def install(self) -> None:
        from oban import Oban
        from oban.schema import install

        pg_harness.fresh_database(self.database)

        async def client() -> Any:
            self.pool = await Oban.create_pool(self.dsn)
            await install(self.pool)
            return Oban(pool=self.pool)  # no queues: a client that only enqueues

        self.oban = self.run(client())

    async def one(self, i: int | None) -> None:
        from oban_jobs import Noop

        await self.oban.enqueue(Noop.new({} if i is None else {"i": i}))

    async def many(self, count: int) -> None:
        from oban_jobs import Noop

        await self.oban.enqueue_many([Noop.new({}) for _ in range(count)])

    def close(self) -> None:
        if self.pool is not None:
            self.run(self.pool.close())
        self.loop.close()

    @classmethod
    def consume(cls) -> None:
        import oban_jobs  # noqa: F401  (registers the worker)
        import uvloop
        from oban import Oban

        async def main() -> None:
            pool = await Oban.create_pool(cls.dsn)
            oban = Oban(pool=pool, queues={"bench": cls.LIMIT})
            pg_harness.wait_for_go()
            await oban.start()
            await asyncio.Event().wait()

        uvloop.run(main())


# -- Procrastinate --------------------------------------------------------------


async def _procrastinate_noop(i: Any = None) -> None:
    pg_harness.report_start(i)


def _procrastinate_app(dsn: str) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    task = app.task(name="noop", queue="bench")(_procrastinate_noop)
    return app, task


class Procrastinate(_Peer):
    name = "procrastinate"
    database = "bench_pg_procrastinate"
    dsn = f"{HOST}/{database}"
    COMPLETED = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    CONCURRENCY = 100

    def __init__(self) -> None:
        self.app, self.task = _procrastinate_app(self.dsn)
        self.opened: Any = None

    def install(self) -> None:
        pg_harness.fresh_database(self.database)
        self.opened = self.app.open()
        self.opened.__enter__()
        self.app.schema_manager.apply_schema()

    def fill(self, n: int) -> None:
        for start in range(0, n, FILL_CHUNK):
            self.task.batch_defer(*([{}] * min(FILL_CHUNK, n - start)))

    def enqueue_single(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.task.defer()
        return time.perf_counter() - t0

    def enqueue_bulk(self, n: int, batch: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n // batch):
            self.task.batch_defer(*([{}] * batch))
        return time.perf_counter() - t0

    def enqueue_one(self, i: int) -> None:
        self.task.defer(i=i)

    def close(self) -> None:
        if self.opened is not None:
            self.opened.__exit__(None, None, None)

    @classmethod
    def consume(cls) -> None:
        import logging

        logging.getLogger("procrastinate").setLevel(logging.ERROR)
        app, _ = _procrastinate_app(cls.dsn)
        with app.open():
            pg_harness.wait_for_go()
            app.run_worker(queues=["bench"], concurrency=cls.CONCURRENCY, install_signal_handlers=False)


SYSTEMS: dict[str, Any] = {"pgqueuer": PgQueuer, "oban": ObanPy, "procrastinate": Procrastinate}

if __name__ == "__main__":
    peer = SYSTEMS[sys.argv[1]]
    sys.exit(pg_harness.main(peer, peer.consume, sys.argv[2:]))
