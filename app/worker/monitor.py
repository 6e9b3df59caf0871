"""The pool's monitor: one thread that enforces handler timeouts, beats
for the held jobs, sheds prefetched jobs when every thread is stuck on a
slow one, and records the pool's health (abandoned threads) where every
process's Workers page reads it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

from jobdeck.store import Outcome
from jobdeck.worker.logs import Logging
from jobdeck.worker.results import first_line
from jobdeck.worker.shared import Slot, log
from sqlalchemy.exc import DBAPIError, OperationalError


class Monitoring(Logging):
    """Timeouts, heartbeats, shedding, health and the log flushes; part of
    ``WorkerPool``."""

    on_unhealthy: Callable[[str], None] | None
    heartbeat_interval: float
    _reported_health: tuple[int, str | None]
    _told_unhealthy: bool

    SHED_AFTER = 0.25
    """Seconds every thread must have been busy before prefetched jobs are shed."""

    def check_timeouts_once(self, mono_now: float | None = None) -> list[int]:
        """Fail attempts that ran past their type's timeout and give their
        thread's place to a new one; the late result will be refused."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        expired: list[Slot] = []
        with self._lock:
            for job_id, slot in list(self._running.items()):
                if slot.deadline is not None and mono_now >= slot.deadline:
                    slot.abandoned = True
                    del self._running[job_id]
                    expired.append(slot)
                    if slot.thread is not threading.current_thread():
                        self._abandoned.append(slot.thread)
        for slot in expired:
            self.flush_log(slot.log)  # what it logged lands before its failure
            spec = self.deck.registry.get(slot.job.type)
            seconds = spec.timeout if spec else 0
            self._acks.put(
                Outcome(
                    slot.job.id,
                    self.worker_id,
                    attempt=slot.job.attempt,
                    started_at=slot.started,
                    error=f"timed out after {seconds:g} s",
                    kind="timed_out",
                )
            )
            if not self._stopping.is_set():
                self._spawn_executor()
        return [s.job.id for s in expired]

    def shed_once(self, mono_now: float | None = None) -> list[int]:
        """Give prefetched, unstarted jobs back when every thread is stuck on
        a slow job: the prefetch was sized for fast jobs, and the held ones
        would wait here while other processes sit idle. Released jobs go back
        to ``pending`` with no attempt counted; any pool (this one included)
        claims them again in claim order."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        if self._stopping.is_set() or self._work.empty():
            return []
        with self._lock:
            ages = [mono_now - s.started_mono for s in self._running.values() if not s.abandoned]
            if len(ages) < self.threads or min(ages) < self.SHED_AFTER:
                return []
            # What the running jobs already show about how long jobs take here.
            self._avg_duration = max(self._avg_duration or 0.0, min(ages))
        shed = self._take_queued()
        if not shed:
            return []
        held = [(j.id, j.attempt) for j in shed]
        released = self._retrying(lambda: self.store.release(self.worker_id, held, self.deck.clock()))
        with self._lock:
            self._inflight -= len(shed)
            self._holding.difference_update(j.id for j in shed)
        log.info("shed %d prefetched jobs while all %d threads run slow jobs", len(released), self.threads)
        return released

    def _monitor_loop(self) -> None:
        # The first batch of log lines waits one whole interval too: an
        # attempt that starts with the pool is not split by the first tick.
        self._next_log_flush = time.monotonic() + self.deck.log_limits.flush_interval
        while not self._acker_stop.wait(0.1):
            self.check_timeouts_once()
            self.flush_logs_due()
            try:
                self.health_once()
            except Exception as exc:
                log.warning("recording the pool's health failed: %s", first_line(exc))
            try:
                self.shed_once()
            except (OperationalError, DBAPIError) as exc:
                log.warning("shedding prefetched jobs failed: %s", exc.__class__.__name__)

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
            self._give_back_prefetched()
        state = (self.abandoned_threads(), reason)
        if state != self._reported_health:
            self.store.set_worker_health(self.worker_id, state[0], reason, now or self.deck.clock())
            self._reported_health = state
        return reason

    def _give_back_prefetched(self) -> None:
        """An unhealthy pool takes no new jobs, and the ones it claimed but
        has not started are new jobs too: each could hang and cost another
        thread. Release them (``pending``, no attempt counted) for a healthy
        process. One try per monitor tick: if the database refuses, they are
        queued again and the next tick retries."""
        with self._refill_lock:
            unstarted = self._held + self._take_queued()
            self._held = []
            if not unstarted:
                return
            try:
                released = self.store.release(self.worker_id, [(j.id, j.attempt) for j in unstarted], self.deck.clock())
            except Exception:
                for job in unstarted:
                    self._work.put(job)
                raise
            with self._lock:
                self._inflight -= len(unstarted)
                self._holding.difference_update(j.id for j in unstarted)
        log.warning("unhealthy: gave %d claimed, unstarted jobs back", len(released))
