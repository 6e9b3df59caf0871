"""The executor scenario's Redis peers (``bench/executor_bench.py``), run
inside ``bench/.venv-exec``: ``python exec_peers.py SYSTEM N`` measures
once in a fresh process and prints one JSON line.

- ``arq N``: arq's async worker drains ``N`` pre-enqueued ``async def``
  no-op jobs, ``max_jobs=100`` (Jobdeck's ``async_concurrency`` and
  Procrastinate's concurrency in the same table), burst mode; jobs/s from
  the worker's start until it has found the queue empty.
- ``saq N``: SAQ's worker, ``concurrency=100``, the same ``async def``
  no-op; jobs/s from the worker's start until its ``after_process`` hook
  has counted ``N`` jobs.
- ``celery-prefork N`` / ``celery-threads N``: a Celery worker with 2
  slots (``-c 2``), prefork processes or threads, Redis broker, results
  ignored; ``rq-fork N`` / ``rq-simple N``: 2 RQ worker processes in burst
  mode, forking a work-horse per job (``Worker``, RQ's default) or running
  the job in the worker itself (``SimpleWorker``). Their job adds one to a
  Redis counter (``exec_jobs``); ``WARM`` jobs are run first (the worker's
  start-up, its children's), then jobs/s is taken from the counter over the
  next ``N``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import exec_jobs

HERE = Path(__file__).resolve().parent
WARM = 50
POLL = 0.005


async def arq_noop(ctx: dict[str, Any]) -> None:
    """arq's no-op: an ``async def``, as every arq job is."""


def arq_drain(n: int) -> dict[str, float]:
    from arq import Worker, create_pool
    from arq.connections import RedisSettings

    settings = RedisSettings(host="127.0.0.1", port=6379, database=13)

    async def fill() -> None:
        redis = await create_pool(settings)
        await redis.flushdb()
        for start in range(0, n, 500):
            await asyncio.gather(*(redis.enqueue_job("arq_noop") for _ in range(min(500, n - start))))
        await redis.aclose()

    asyncio.run(fill())
    worker = Worker(functions=[arq_noop], redis_settings=settings, burst=True, max_jobs=100, keep_result=0,
                    handle_signals=False, poll_delay=0.01)  # fmt: skip
    t0 = time.perf_counter()
    worker.run()
    elapsed = time.perf_counter() - t0
    if worker.jobs_complete != n:
        raise RuntimeError(f"arq completed {worker.jobs_complete} of {n} ({worker.jobs_failed} failed)")
    return {"rate": n / elapsed, "seconds": elapsed}


async def saq_noop(ctx: dict[str, Any]) -> None:
    """SAQ's no-op, an ``async def`` too."""


def saq_drain(n: int) -> dict[str, float]:
    from saq import Queue, Worker

    async def drain() -> dict[str, float]:
        queue = Queue.from_url("redis://127.0.0.1:6379/12")
        await queue.connect()
        await queue.redis.flushdb()
        for start in range(0, n, 500):
            await asyncio.gather(*(queue.enqueue("saq_noop") for _ in range(min(500, n - start))))
        done, finished = [0], asyncio.Event()

        async def after(ctx: dict[str, Any]) -> None:
            done[0] += 1
            if done[0] >= n:
                finished.set()

        worker = Worker(queue, functions=[saq_noop], concurrency=100, after_process=after)
        t0 = time.perf_counter()
        running = asyncio.create_task(worker.start())
        try:
            await asyncio.wait_for(finished.wait(), timeout=60 + n / 20)
        finally:
            elapsed = time.perf_counter() - t0
            await worker.stop()
            running.cancel()
        await queue.disconnect()
        return {"rate": n / elapsed, "seconds": elapsed}

    return asyncio.run(drain())


# -- Celery and RQ: a worker process started on a full queue, timed by the counter ----


def celery_app() -> Any:
    from celery import Celery

    app = Celery("exec_peers", broker=exec_jobs.REDIS_URL)
    app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
    app.task(name="counted", queue="bench")(exec_jobs.counted)
    return app


app = celery_app() if os.environ.get("BENCH_CELERY") == "1" else None


def _redis() -> Any:
    from redis import Redis

    redis = Redis.from_url(exec_jobs.REDIS_URL)
    redis.flushdb()
    return redis


def _fill(system: str, total: int) -> list[str]:
    """Enqueue ``total`` counted jobs; the worker command that drains them."""
    if system.startswith("celery"):
        task = celery_app().tasks["counted"]
        with task.app.producer_or_acquire() as producer:
            for _ in range(total):
                task.apply_async(producer=producer)
        pool = "prefork" if system == "celery-prefork" else "threads"
        return [sys.executable, "-m", "celery", "-A", "exec_peers", "worker", "-P", pool, "-c", "2", "-Q", "bench",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]  # fmt: skip
    from rq import Queue

    q = Queue("bench", connection=_redis_conn[0])
    for start in range(0, total, 1000):
        q.enqueue_many([Queue.prepare_data("exec_jobs.rq_counted", result_ttl=0)
                        for _ in range(min(1000, total - start))])  # fmt: skip
    worker = "rq.worker.Worker" if system == "rq-fork" else "rq.worker.SimpleWorker"
    return [sys.executable, "-m", "rq.cli", "worker", "--burst", "-q", "-w", worker, "--url", exec_jobs.REDIS_URL,
            "bench"]  # fmt: skip


_redis_conn: list[Any] = []


def counted_drain(system: str, n: int) -> dict[str, float]:
    redis = _redis()
    _redis_conn[:] = [redis]
    command = _fill(system, WARM + n)
    env = dict(os.environ, PYTHONPATH=str(HERE), BENCH_CELERY="1")
    workers = 1 if system.startswith("celery") else 2
    procs = [subprocess.Popen(command, env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]  # fmt: skip
    try:
        deadline = time.monotonic() + 60 + n / 20
        while (c0 := int(redis.get(exec_jobs.DONE) or 0)) < WARM:
            _check(procs, deadline, c0)
            time.sleep(POLL)
        t0 = time.perf_counter()
        while (done := int(redis.get(exec_jobs.DONE) or 0)) < WARM + n:
            _check(procs, deadline, done, ended_ok=not system.startswith("celery"))
            time.sleep(POLL)
        elapsed = time.perf_counter() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return {"rate": (done - c0) / elapsed, "seconds": elapsed}


def _check(procs: list[subprocess.Popen[bytes]], deadline: float, done: int, ended_ok: bool = False) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"stalled at {done} jobs")
    if not ended_ok and any(p.poll() is not None for p in procs):
        raise RuntimeError(f"a worker exited at {done} jobs")


if __name__ == "__main__":
    system, count = sys.argv[1], int(sys.argv[2])
    result = (
        arq_drain(count) if system == "arq" else saq_drain(count) if system == "saq" else counted_drain(system, count)
    )
    print(json.dumps(result), flush=True)
