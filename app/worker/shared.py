"""What the worker pool's threads share: the slots of running jobs, the
queues between the fetcher, the executors and the acker, and the few steps
every loop takes (the room to claim into, a retried write, the health check).

``WorkerPool`` is built from ``PoolShared`` and its parts: ``Acknowledging``
(``jobdeck.worker.acks``: outcomes written in batches, with the refill) and
``Monitoring`` (``jobdeck.worker.monitor``: timeouts, heartbeats, shedding and
health), on ``Logging`` (``jobdeck.worker.logs``: the attempts' log buffers). The state is declared here once and set in ``WorkerPool.__init__``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from jobdeck.deck import Jobdeck
from jobdeck.jobs.joblogs import AttemptLog
from jobdeck.store import JobRecord, Outcome, Store
from jobdeck.store.faults import Outage
from jobdeck.worker.lease import CancelSignal, Lease, SetAside
from sqlalchemy.exc import DisconnectionError

log = logging.getLogger("jobdeck.worker")
T = TypeVar("T")

STOP_MARGIN = 2.0
"""Seconds beyond ``shutdown_grace`` that ``stop`` keeps retrying its final
writes while the database is unreachable; then it gives up (the jobs it
could not write stay ``running`` until the stalled sweep rescues them)."""

RETRY_CAP = 1.0
"""Longest pause between retries of a write (or a claim) during an outage:
once the database is back, work resumes within about this long."""


class Unreachable(DisconnectionError):
    """A write the stopping pool does not try: the database is not answering.
    An outage like a lost connection to whoever handles it (the outcomes are kept)."""


@dataclass
class Slot:
    """A job an executor is running: the monitor times it out by ``deadline``,
    ``abandoned`` refuses the late result of one it gave up on, and
    ``cancelled`` is the handler's ``ctx.cancelled``, set on a cancel;
    ``log`` buffers what the handler logs (``ctx.log``)."""

    job: JobRecord
    started: datetime
    started_mono: float
    deadline: float | None
    thread: threading.Thread
    abandoned: bool = field(default=False)
    cancelled: CancelSignal = field(default_factory=CancelSignal)
    log: AttemptLog | None = field(default=None)
    """The attempt's log buffer, flushed by the monitor and at the end."""


class PoolShared:
    """The state and steps the pool's loops share (see the module docstring)."""

    deck: Jobdeck
    store: Store
    threads: int
    worker_id: str
    batch: int
    queues: list[str] | None
    max_abandoned_threads: int
    _work: queue.SimpleQueue[JobRecord]
    _acks: queue.SimpleQueue[Outcome]
    _lock: threading.Lock
    _running: dict[int, Slot]
    _inflight: int
    _avg_duration: float | None
    _room: threading.Event
    _wake: threading.Event
    _stopping: threading.Event
    _acker_stop: threading.Event
    _refill_lock: threading.Lock
    _held: list[JobRecord]
    """Jobs the acker's last refill claimed and holds until its next claim (``Acknowledging._hand_over``)."""
    _abandoned: list[threading.Thread]
    _give_up_at: float | None
    _cancel_before_start: set[int]
    lease: Lease
    """This pool's lease on its jobs (``jobdeck.worker.lease``)."""
    _set_aside: list[SetAside]
    """Jobs held but neither run nor acknowledged while the lease is lost."""
    _holding: set[int]
    """The ids of every job this pool holds, from its claim until its outcome
    is written or it is given back (``Leasing._release_orphans`` reads it)."""
    write_outage: Outage | None
    """Why the pool's last write failed while it is still being retried (no claims meanwhile)."""
    _unlanded: dict[int, Outcome]
    """Outcomes taken for writing that have not landed (``Acknowledging.flush_acks_once``)."""
    flush_outcome_logs: Callable[[list[Any]], int]
    """``jobdeck.worker.logs.Logging``'s: the acker writes its batch's log lines with it."""

    def cancel_running(self, job_ids: list[int], held: bool = False, reason: str = "cancelled") -> list[int]:
        """Tell the handlers of these jobs that they were cancelled (set
        their ``ctx.cancelled``, with ``reason``); returns the ids of those running here.
        ``held``: the ids are all of this pool's cancelled jobs (its heartbeat
        said so), so those not started yet are remembered, until the next
        beat, and never start their handler."""
        told: list[int] = []
        with self._lock:
            for job_id in job_ids:
                slot = self._running.get(job_id)
                if slot is not None:
                    slot.cancelled.cancel(reason)
                    told.append(job_id)
            if held:
                self._cancel_before_start = set(job_ids) - set(told)
        return told

    def _capacity(self) -> int:
        """How many jobs to hold: the threads, plus a prefetch sized so the
        held jobs start within about 50 ms (many for tiny jobs, none for slow)."""
        avg = self._avg_duration
        # On SQLite up to two batches: the acker's refill claims a full batch
        # while the last one's acks are written, in the same transaction. On
        # PostgreSQL the fetcher claims on a connection of its own while the
        # acker completes, so it may run ahead: with two batches it waited
        # for each completion to free room, and the two statements took
        # turns instead of overlapping (four: the 1-process drain ~1.1x).
        batches = 2 if self.store.sqlite else 4
        prefetch = 0 if avg is None else int(min(batches * self.batch, self.threads * 0.05 / max(avg, 1e-6)))
        return self.threads + prefetch

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Run a store write until it succeeds, retrying only what can
        succeed on a later try (``jobdeck.store.faults.outage_of``): an outcome is
        never dropped because the database was briefly unreachable, full or
        read-only, and an error that can never succeed (a value the database
        refuses) is raised at once instead of wedging the pool. While a write
        fails so, ``write_outage`` says why and the pool claims nothing new.
        While stopping, retries end at the stop's deadline (``shutdown_grace``
        + ``STOP_MARGIN``)."""
        delay = 0.05
        failed = False
        if self._give_up_at is not None and self.lease.lost:
            # Stopping, and no beat has landed for half of stall_timeout: each
            # try would wait out a connect or a dropped connection (5-15 s);
            # what is not written is kept (``keep_unlanded``) or rescued.
            raise Unreachable("the database has not answered for half of stall_timeout; stopping without writing")
        while True:
            try:
                result = fn()
            except Exception as exc:
                outage = self.store.storage.note(exc)
                if outage is None:
                    raise
                self.write_outage = outage
                give_up = self._give_up_at
                if give_up is not None and time.monotonic() + delay > give_up:
                    log.error("database write failed (%s) while stopping; giving up", outage.cause)
                    raise
                log.warning("database write failed (%s: %s); retrying in %.2fs", exc.__class__.__name__,
                            outage.cause, delay)  # fmt: skip
                time.sleep(delay)  # backoff between retries of one write; nothing to wake for
                delay = min(RETRY_CAP, delay * 2)
                failed = True
                continue
            if failed:  # it landed: claim again at once
                self.write_outage = None
                self.store.storage.wrote()
                self._wake.set()
            return result

    def _take_queued(self) -> list[JobRecord]:
        """Take every job waiting for an executor off the work queue (a
        shutdown sentinel stays for the executors)."""
        taken: list[JobRecord] = []
        while True:
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                return taken
            if job is None:
                self._work.put(job)
                return taken
            taken.append(job)

    def abandoned_threads(self) -> int:
        """Threads abandoned after a timeout that are still running their
        handler (one that returns at last lets its thread end)."""
        with self._lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            return len(self._abandoned)

    def unhealthy_reason(self) -> str | None:
        """Why this pool is unhealthy, or None. A Python thread cannot be
        killed, so each hung handler past its timeout keeps a thread (and
        whatever it holds); past ``max_abandoned_threads`` the pool claims
        nothing more, and only a restart of the process frees them."""
        n = self.abandoned_threads()
        if n < self.max_abandoned_threads:
            return None
        return (
            f"{n} handler threads abandoned after a timeout are still running "
            f"(max_abandoned_threads = {self.max_abandoned_threads}); no new jobs are claimed "
            "until they end; restart the process to free them"
        )

    def _spawn_executor(self) -> None:
        """Start one more executor thread (``WorkerPool`` runs them)."""
        raise NotImplementedError
