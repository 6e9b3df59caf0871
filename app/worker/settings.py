"""What a worker pool is told, and nothing more: the numbers it runs by and
the few per-type questions it asks of the config (which errors are never
retried, how many snoozes a type may take, whether a concurrency limit may
hold a claim back). The deck's wiring (``jobdeck.runtime.pool_for``) reads
them from a ``Config``; a test builds them by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdeck.core.loglines import LogLimits
from jobdeck.jobs.snooze import DEFAULT_MAX_SNOOZES


def _no_names(job_type: str) -> tuple[str, ...]:
    return ()


def _default_snoozes(job_type: str) -> int:
    return DEFAULT_MAX_SNOOZES


def _no_limits() -> bool:
    return False


def _declared_executor(job_type: str, declared: str | None, queue: str | None) -> str:
    return declared or "thread"


def _no_memory_limit(job_type: str, queue: str | None) -> int | None:
    return None


@dataclass(frozen=True)
class PoolSettings:
    """A pool's settings (see the module docstring). The numbers are the
    config's options of the same names (``threads`` is ``workers``, ``batch``
    is ``claim_batch``); their defaults and meaning are defined once, on
    ``jobdeck.core.config_schema.Config``, so none is repeated here."""

    spool_folder: Path
    """Where outcomes that never landed are kept for the next pool on this host (``jobdeck.worker.spool``)."""
    threads: int
    async_concurrency: int
    batch: int
    poll_interval: float
    heartbeat_interval: float
    stall_timeout: float
    shutdown_grace: float
    max_abandoned_threads: int
    max_result_bytes: int
    log_limits: LogLimits = field(default_factory=LogLimits)
    non_retryable: Callable[[str], tuple[str, ...]] = _no_names
    """``[types."T"] non_retryable``: exception class names no retry can fix."""
    max_snoozes: Callable[[str], int] = _default_snoozes
    """A type's cap on snoozes in a row."""
    limits_hold_back: Callable[[], bool] = _no_limits
    """Whether a concurrency limit may hold claims back now: a job's end may then make another claimable."""
    executor: Callable[[str, str | None, str | None], str] = _declared_executor
    """Where a type's jobs run, "thread" or "process", from its type, its
    handler's ``executor=`` and its queue (``jobdeck.core.config_tables.executor_of``)."""
    memory_limit: Callable[[str, str | None], int | None] = _no_memory_limit
    """A process type's ``memory_limit`` in bytes, from its type or its queue."""
    process_workers: int = 0
    """0: the number of CPUs."""
    max_jobs_per_child: int = 0
    cancel_grace: float = 10.0
    handler_modules: tuple[str, ...] = ()
    """Imported by each child process, where process handlers are found by name."""
    tracing: Any = None
    """The attempts' tracer (``jobdeck.tracing.AttemptTracer``) when tracing is on; None: off."""
