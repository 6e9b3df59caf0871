"""The one object that starts and stops a process's background services:
the worker pool and the scheduler. Started from the CLI or ``wsgi.py``,
never from ``create_app``, and at most once per process."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from jobdeck.core.clock import DatabaseClock, Reading
from jobdeck.core.config_tables import executor_of, memory_limit, non_retryable
from jobdeck.deck import Jobdeck
from jobdeck.jobs.snooze import max_snoozes
from jobdeck.maintenance.clock_check import ClockCheck
from jobdeck.store.timekeeping import record_clock_offset
from jobdeck.worker.commit_watch import watcher_for
from jobdeck.worker.listener import listener_for
from jobdeck.worker.pool import WorkerPool
from jobdeck.worker.settings import PoolSettings

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger("jobdeck.runtime")

EXIT_UNHEALTHY = 3
"""The exit status of ``jobdeck serve``/``worker`` stopped by ``exit_when_unhealthy``:
non-zero, so a supervisor restarts the process."""

_active: Runtime | None = None
_active_lock = threading.Lock()


def pool_for(
    deck: Jobdeck,
    threads: int | None = None,
    *,
    worker_id: str | None = None,
    batch: int | None = None,
    poll_interval: float | None = None,
    heartbeat_interval: float | None = None,
    queues: list[str] | None = None,
    on_unhealthy: Callable[[str], None] | None = None,
) -> WorkerPool:
    """A worker pool on the deck's store, clock and handlers, with the
    config's settings (``threads`` and the other numbers given here override
    them); it reports to the deck's health while it runs."""
    cfg = deck.config
    controls = deck.queues
    registry = deck.registry
    settings = PoolSettings(
        spool_folder=Path(cfg.instance_path) / "acks",
        threads=cfg.workers if threads is None else threads,
        batch=batch or cfg.claim_batch,
        async_concurrency=cfg.async_concurrency,
        poll_interval=poll_interval or cfg.poll_interval,
        heartbeat_interval=heartbeat_interval or cfg.heartbeat_interval,
        stall_timeout=cfg.stall_timeout,
        shutdown_grace=cfg.shutdown_grace,
        max_abandoned_threads=cfg.max_abandoned_threads,
        max_result_bytes=cfg.max_result_bytes,
        log_limits=deck.log_limits,
        non_retryable=lambda job_type: non_retryable(cfg, job_type),
        max_snoozes=lambda job_type: max_snoozes(cfg, registry, job_type),
        limits_hold_back=controls.holding_back,
        executor=lambda job_type, declared, queue: executor_of(cfg, job_type, declared, queue),
        memory_limit=lambda job_type, queue: memory_limit(cfg, job_type, queue),
        process_workers=cfg.process_workers,
        max_jobs_per_child=cfg.max_jobs_per_child,
        cancel_grace=cfg.cancel_grace,
        handler_modules=tuple(cfg.handler_modules),
        tracing=deck.tracing,
    )
    return WorkerPool(
        deck.store, deck.clock, registry, settings,
        worker_id=worker_id, queues=queues, health=deck.health, on_unhealthy=on_unhealthy,
    )  # fmt: skip


class Service(Protocol):
    def start(self) -> None: ...

    def stop(self, grace: float | None = None) -> None: ...


class Runtime:
    def __init__(self, deck: Jobdeck, *, workers: int | None = None, services: bool = True) -> None:
        self.deck = deck
        threads = deck.config.workers if workers is None else workers
        self.exit_status = 0
        """Non-zero once the process should exit to be restarted (the CLI exits with it)."""
        on_unhealthy = self._exit_to_restart if deck.config.exit_when_unhealthy else None
        self.pool: WorkerPool | None = pool_for(deck, threads, on_unhealthy=on_unhealthy) if threads > 0 else None
        self.services: list[Service] = []
        if self.pool is not None:
            # Wake on other processes' jobs: LISTEN on PostgreSQL, PRAGMA data_version on SQLite.
            wake = self.pool.wake
            listener = listener_for(deck.store, wake) or watcher_for(
                deck.store, wake, types=deck.registry.names, queues=self.pool.queues, clock=deck.clock,
                has_room=self.pool.has_room,
            )  # fmt: skip
            if listener is not None:
                self.services.append(listener)
        if isinstance(deck.clock, DatabaseClock):
            self.services.append(ClockCheck(deck.clock, deck.config.clock_check_interval, self._record_reading))
        if services:
            from jobdeck.maintenance.scheduler import SchedulerService, maintenance_loops

            loops = maintenance_loops(deck.schedules, deck.schedule_health, deck.maintenance, deck.thresholds,
                                      deck.config.sweep_interval)  # fmt: skip
            self.services.append(SchedulerService(loops, deck.clock, lambda: len(deck.schedules.schedules)))
        self._started = False

    def _record_reading(self, reading: Reading) -> None:
        """Show this process's clock offset on the Workers page (its pool's row)."""
        if self.pool is not None:
            record_clock_offset(self.deck.store, self.pool.worker_id, reading.offset)

    def _exit_to_restart(self, reason: str) -> None:
        """``exit_when_unhealthy``: the abandoned threads cannot be freed
        in-process, so stop the way an operator's SIGTERM would (gracefully,
        within ``shutdown_grace``) and let the CLI exit non-zero."""
        log.error("exiting so that a supervisor restarts this process (exit_when_unhealthy): %s", reason)
        self.exit_status = EXIT_UNHEALTHY
        os.kill(os.getpid(), signal.SIGTERM)

    @classmethod
    def for_app(cls, app: Flask, **kwargs: object) -> Runtime:
        return cls(app.extensions["jobdeck"], **kwargs)  # type: ignore[arg-type]

    def start(self) -> None:
        global _active
        with _active_lock:
            if _active is not None and _active is not self:
                raise RuntimeError("a Jobdeck runtime is already running in this process")
            if self._started:
                return
            _active = self
            self._started = True
        if self.pool is not None:
            self.pool.start()
        for service in self.services:
            service.start()

    def hurry(self) -> None:
        """Cut a ``stop`` in progress short: running jobs are released now
        instead of at the end of the grace (a second shutdown signal)."""
        if self.pool is not None:
            self.pool.hurry()

    def stop(self, grace: float | None = None) -> None:
        global _active
        if not self._started:
            return
        for service in reversed(self.services):
            service.stop(grace)
        if self.pool is not None:
            self.pool.stop(grace)
        with _active_lock:
            if _active is self:
                _active = None
            self._started = False
