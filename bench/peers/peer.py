"""Peer adapters, run inside bench/.venv: ``python peer.py NAME SCENARIO N
[THREADS]`` prints one JSON object ``{"rate": jobs_per_second}``.

The same no-op job everywhere; the same worker count where the peer allows
it. Huey: SqliteHuey on a file with its own consumer (thread workers); RQ:
the local Redis with N SimpleWorker processes in burst mode (RQ has no
threads); Procrastinate: the local PostgreSQL (database bench_procrastinate)
with one worker of concurrency N.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REDIS_URL = "redis://127.0.0.1:6379/15"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
PG_BENCH = "postgresql://postgres@127.0.0.1:5432/bench_procrastinate"
_count = [0]
_count_lock = threading.Lock()
_done = threading.Event()
_target = [0]


# -- Huey -------------------------------------------------------------------


def _huey(path: Path, synchronous: str = "FULL"):  # type: ignore[no-untyped-def]
    from huey import SqliteHuey

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    huey = SqliteHuey("bench", filename=str(path), results=False, journal_mode="wal", fsync=synchronous == "FULL")

    @huey.task()
    def counted() -> None:
        with _count_lock:
            _count[0] += 1
            if _count[0] >= _target[0]:
                _done.set()

    return huey, counted


def huey_drain(n: int, threads: int) -> float:
    tmp = Path(tempfile.mkdtemp())
    huey, task = _huey(tmp / "huey.db")
    huey.immediate = False
    for _ in range(n):
        task()
    _count[0], _target[0] = 0, n
    _done.clear()
    consumer = huey.create_consumer(
        workers=threads, worker_type="thread", periodic=False, initial_delay=0.001, backoff=1.0, max_delay=0.01
    )
    t0 = time.perf_counter()
    consumer.start()
    _done.wait(timeout=600)
    rate = n / (time.perf_counter() - t0)
    consumer.stop(graceful=True)
    return rate


def huey_enqueue(n: int, _threads: int) -> float:
    tmp = Path(tempfile.mkdtemp())
    huey, task = _huey(tmp / "huey.db")
    t0 = time.perf_counter()
    for _ in range(n):
        task()
    return n / (time.perf_counter() - t0)


def huey_idle(seconds: int, threads: int) -> float:
    """Not a rate: the share of one core (percent) an idle consumer with
    Huey's defaults (``bench.idle_bench``) spent over ``seconds``, after
    three seconds to settle."""
    tmp = Path(tempfile.mkdtemp())
    huey, _task = _huey(tmp / "huey.db")
    consumer = huey.create_consumer(workers=threads, worker_type="thread")
    consumer.start()
    _done.wait(3.0)  # the consumer's start-up is left out (nothing sets _done here)
    cpu, wall = time.process_time(), time.monotonic()
    _done.wait(seconds)
    share = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
    consumer.stop(graceful=True)
    return share


# -- RQ ---------------------------------------------------------------------


def _rq():  # type: ignore[no-untyped-def]
    from redis import Redis
    from rq import Queue

    redis = Redis.from_url(REDIS_URL)
    redis.flushdb()
    return redis, Queue("bench", connection=redis)


def rq_enqueue(n: int, _threads: int) -> float:
    _, q = _rq()
    t0 = time.perf_counter()
    for _ in range(n):
        q.enqueue("peer_jobs.noop", result_ttl=0)
    return n / (time.perf_counter() - t0)


def rq_enqueue_many(n: int, _threads: int, batch: int = 1000) -> float:
    from rq import Queue

    _, q = _rq()
    t0 = time.perf_counter()
    for _ in range(n // batch):
        q.enqueue_many([Queue.prepare_data("peer_jobs.noop", result_ttl=0) for _ in range(batch)])
    return (n // batch) * batch / (time.perf_counter() - t0)


def rq_drain(n: int, threads: int) -> float:
    from rq import Queue

    _, q = _rq()
    for start in range(0, n, 1000):
        q.enqueue_many([Queue.prepare_data("peer_jobs.noop", result_ttl=0) for _ in range(min(1000, n - start))])
    env = dict(os.environ, PYTHONPATH=str(HERE))
    cmd = [sys.executable, "-m", "rq.cli", "worker", "--burst", "-q", "-w", "rq.worker.SimpleWorker",
           "--url", REDIS_URL, "bench"]  # fmt: skip
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, cwd=HERE) for _ in range(threads)]
    for p in procs:
        p.wait()
    rate = n / (time.perf_counter() - t0)
    if len(q) != 0:
        raise RuntimeError(f"rq left {len(q)} jobs")
    return rate


# -- Procrastinate ------------------------------------------------------------


def _procrastinate():  # type: ignore[no-untyped-def]
    import procrastinate
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bench_procrastinate")
        admin.execute("CREATE DATABASE bench_procrastinate")
    import peer_jobs

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PG_BENCH))
    task = app.task(name="noop", queue="bench")(peer_jobs.noop)
    with app.open():
        app.schema_manager.apply_schema()
    return app, task


def procrastinate_enqueue(n: int, _threads: int) -> float:
    app, task = _procrastinate()
    with app.open():
        t0 = time.perf_counter()
        for _ in range(n):
            task.defer()
        return n / (time.perf_counter() - t0)


def procrastinate_enqueue_many(n: int, _threads: int, batch: int = 1000) -> float:
    app, task = _procrastinate()
    with app.open():
        t0 = time.perf_counter()
        for _ in range(n // batch):
            task.batch_defer(*([{}] * batch))
        return (n // batch) * batch / (time.perf_counter() - t0)


def procrastinate_drain(n: int, threads: int) -> float:
    import logging

    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app, task = _procrastinate()
    with app.open():
        for start in range(0, n, 1000):
            task.batch_defer(*([{}] * min(1000, n - start)))
        t0 = time.perf_counter()
        app.run_worker(queues=["bench"], concurrency=threads, wait=False, install_signal_handlers=False)
        return n / (time.perf_counter() - t0)


if __name__ == "__main__":
    name, scenario, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    rate = globals()[f"{name}_{scenario}"](count, threads)
    print(json.dumps({"rate": rate}))
