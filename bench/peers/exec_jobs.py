"""The counted no-op of the executor scenario's Redis peers (Celery, RQ),
importable by name by their worker processes: it adds one to a Redis
counter, which the harness reads to time the drain."""

from __future__ import annotations

import os
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/14"
DONE = "bench:exec:done"
_client: dict[int, Any] = {}


def _redis() -> Any:
    """One client per process (a forked child must not share its parent's socket)."""
    pid = os.getpid()
    if pid not in _client:
        from redis import Redis

        _client[pid] = Redis.from_url(REDIS_URL)
    return _client[pid]


def rq_counted() -> None:
    """RQ's job: counts on the connection RQ gave the job (the work-horse's own)."""
    from rq import get_current_job

    job = get_current_job()
    (job.connection if job is not None else _redis()).incr(DONE)


def counted() -> None:
    _redis().incr(DONE)
