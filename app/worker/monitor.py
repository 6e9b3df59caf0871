"""The pool's monitor: one thread that enforces handler timeouts, sheds
prefetched jobs when every thread is stuck on a slow one, flushes the
running attempts' logs, and records the pool's health (abandoned threads)
where every process's Workers page reads it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jobdeck.jobs.handlers import Registry
from jobdeck.store import Outcome, Store
from jobdeck.store.timekeeping import record_executors
from jobdeck.worker.acks import Acker
from jobdeck.worker.async_loop import Held
from jobdeck.worker.holdings import Holdings
from jobdeck.worker.logs import AttemptLogs
from jobdeck.worker.results import first_line
from jobdeck.worker.writes import Writes
from sqlalchemy.exc import DBAPIError, OperationalError

log = logging.getLogger("jobdeck.worker")


class Monitor:
    """Timeouts, shedding, health and the log flushes of one pool.
    ``replace_executor`` starts a thread in the place of one given up on."""

    SHED_AFTER = 0.25
    """Seconds every thread must have been busy before prefetched jobs are shed."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        registry: Registry,
        holdings: Holdings,
        acker: Acker,
        writes: Writes,
        logs: AttemptLogs,
        *,
        worker_id: str,
        max_abandoned_threads: int,
        replace_executor: Callable[[], None],
        stopping: threading.Event,
        loop_held: Callable[[], Held | None] = lambda: None,
        stall_timeout: float = 60.0,
        on_unhealthy: Callable[[str], None] | None = None,
        executors_now: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.registry = registry
        self.holdings = holdings
        self.acker = acker
        self.writes = writes
        self.logs = logs
        self.worker_id = worker_id
        self.max_abandoned_threads = max_abandoned_threads
        self.replace_executor = replace_executor
        self.loop_held = loop_held
        """The hold of the async handlers' event loop going on now (``jobdeck.worker.async_loop``)."""
        self.stall_timeout = stall_timeout
        self.stopping = stopping
        self.on_unhealthy = on_unhealthy
        """Called once, from the monitor thread, when the pool turns unhealthy
        (``jobdeck.runtime`` uses it for ``exit_when_unhealthy``)."""
        self.abandoned: list[threading.Thread] = []
        """Threads left running a handler past its timeout (see ``check_timeouts_once``)."""
        self._lock = threading.Lock()
        self._reported: tuple[int, str | None] = (0, None)
        self._told_unhealthy = False
        self.executors_now = executors_now
        """What each executor holds now (``Executors.now_held``), kept in the pool's row by ``executors_once``."""
        self._executors_written: tuple[float, dict[str, Any] | None] = (0.0, None)

    # -- health -----------------------------------------------------------------

    def abandoned_threads(self) -> int:
        """Threads abandoned after a timeout that are still running their
        handler (one that returns at last lets its thread end)."""
        with self._lock:
            self.abandoned = [t for t in self.abandoned if t.is_alive()]
            return len(self.abandoned)

    def unhealthy_reason(self) -> str | None:
        """Why this pool is unhealthy, or None. A Python thread cannot be
        killed, so each hung handler past its timeout keeps a thread (and
        whatever it holds); past ``max_abandoned_threads`` the pool claims
        nothing more, and only a restart of the process frees them. So too
        while the async handlers' loop is held past ``stall_timeout``."""
        held = self.loop_held()
        if held is not None and held.seconds >= self.stall_timeout:
            # Every async job of the pool waits; its heartbeats go on, so no
            # other process rescues them: the pool says it, as for abandoned threads.
            return (
                f"the async handlers' event loop has been held by {held.by} for more than "
                f"{self.stall_timeout:g} s (stall_timeout): a blocking call in an async handler; no async job "
                "of this pool runs and no new jobs are claimed until it ends; restart the process to free it"
            )
        n = self.abandoned_threads()
        if n < self.max_abandoned_threads:
            return None
        return (
            f"{n} handler threads abandoned after a timeout are still running "
            f"(max_abandoned_threads = {self.max_abandoned_threads}); no new jobs are claimed "
            "until they end; restart the process to free them"
        )

    def health_once(self, now: datetime | None = None) -> str | None:
        """Write this pool's health into its workers row when it changed (so
        every process's Workers page shows it), and tell ``on_unhealthy``
        the first time it turns unhealthy. Returns the reason, if any."""
        reason = self.unhealthy_reason()
        if reason is not None and not self._told_unhealthy:  # first: it needs no database
            self._told_unhealthy = True
            log.error("worker pool %s is unhealthy: %s", self.worker_id, reason)
            if self.on_unhealthy is not None:
                self.on_unhealthy(reason)
        if reason is not None:
            self.give_back_prefetched()
        state = (self.abandoned_threads(), reason)
        if state != self._reported:
            self.store.set_worker_health(self.worker_id, state[0], reason, now or self.clock())
            self._reported = state
        return reason

    def give_back_prefetched(self) -> None:
        """An unhealthy pool takes no new jobs, and the ones it claimed but
        has not started are new jobs too: each could hang and cost another
        thread. Release them (``pending``, no attempt counted) for a healthy
        process. One try per monitor tick: if the database refuses, they are
        queued again and the next tick retries."""
        with self.acker.refill_lock:
            unstarted = self.acker.take_unstarted()
            if not unstarted:
                return
            try:
                released = self.store.release(self.worker_id, [(j.id, j.attempt) for j in unstarted], self.clock())
            except Exception:
                self.holdings.queue(unstarted)
                raise
            self.holdings.given_back(j.id for j in unstarted)
        log.warning("unhealthy: gave %d claimed, unstarted jobs back", len(released))

    EXECUTORS_EVERY = 2.0
    """Seconds between writes of the executors' summary (when it changed)."""

    def executors_once(self, mono_now: float | None = None) -> bool:
        """Keep what each executor holds in the pool's row, when it changed
        and at most every ``EXECUTORS_EVERY`` seconds; True when written."""
        if self.executors_now is None:
            return False
        mono_now = time.monotonic() if mono_now is None else mono_now
        last, written = self._executors_written
        if mono_now - last < self.EXECUTORS_EVERY:
            return False
        held = self.executors_now()
        if held == written:
            return False
        record_executors(self.store, self.worker_id, held)
        self._executors_written = (mono_now, held)
        return True

    # -- timeouts and shedding ----------------------------------------------------

    def check_timeouts_once(self, mono_now: float | None = None) -> list[int]:
        """Fail attempts that ran past their type's timeout and give their
        thread's place to a new one; the late result will be refused."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        expired = self.holdings.expired(mono_now)
        with self._lock:  # an async job's task is cancelled instead (``jobdeck.worker.async_loop``)
            self.abandoned.extend(
                s.thread for s in expired if not s.on_loop and s.thread is not threading.current_thread()
            )
        for slot in expired:
            self.logs.flush_log(slot.log)  # what it logged lands before its failure
            spec = self.registry.get(slot.job.type)
            seconds = spec.timeout if spec else 0
            self.acker.put(
                Outcome(
                    slot.job.id,
                    self.worker_id,
                    attempt=slot.job.attempt,
                    started_at=slot.started,
                    error=f"timed out after {seconds:g} s",
                    kind="timed_out",
                    executor="async" if slot.on_loop else "thread",
                )
            )
            if not self.stopping.is_set() and not slot.on_loop:
                self.replace_executor()
        return [s.job.id for s in expired]

    def shed_once(self, mono_now: float | None = None) -> list[int]:
        """Give prefetched, unstarted jobs back when every thread is stuck on
        a slow job: the prefetch was sized for fast jobs, and the held ones
        would wait here while other processes sit idle. Released jobs go back
        to ``pending`` with no attempt counted; any pool (this one included)
        claims them again in claim order."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        if self.stopping.is_set() or self.holdings.work.empty():
            return []
        if not self.holdings.all_busy(mono_now, self.SHED_AFTER):
            return []
        shed = self.holdings.take_queued()
        if not shed:
            return []
        held = [(j.id, j.attempt) for j in shed]
        released = self.writes.retrying(lambda: self.store.release(self.worker_id, held, self.clock()))
        self.holdings.given_back(j.id for j in shed)
        log.info("shed %d prefetched jobs while all %d threads run slow jobs", len(released), self.holdings.threads)
        return released

    def loop(self, ended: threading.Event) -> None:
        self.logs.wait_a_whole_interval()
        while not ended.wait(0.1):
            self.check_timeouts_once()
            self.logs.flush_logs_due()
            try:
                self.health_once()
                self.executors_once()
            except Exception as exc:
                log.warning("recording the pool's health failed: %s", first_line(exc))
            try:
                self.shed_once()
            except (OperationalError, DBAPIError) as exc:
                log.warning("shedding prefetched jobs failed: %s", exc.__class__.__name__)
