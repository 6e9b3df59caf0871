"""What a worker pool holds: the jobs it claimed, from the claim until their
outcome is written or they are given back. The fetcher and the acker's
refill add to it, the executors run from its work queue, the acker, the
monitor and the lease take from it; each goes through one of the methods
here, under the one lock, so the count in flight, the ids held and the
running slots always agree."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from jobdeck.jobs.joblogs import AttemptLog
from jobdeck.store import JobRecord
from jobdeck.worker.lease import RELEASED, TIMED_OUT, CancelSignal, Lease, SetAside


@dataclass
class Slot:
    """A job an executor is running: the monitor times it out by ``deadline``,
    ``abandoned`` refuses the late result of one it gave up on, and
    ``cancelled`` is the handler's ``ctx.cancelled``, set on a cancel and
    when the slot is given up (a handler that honours it stops then);
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
    on_loop: bool = field(default=False)
    """An ``async def`` handler's task on the pool's event loop (``thread`` is
    the loop's): a timeout cancels the task and abandons no thread."""


class Holdings:
    """The jobs one pool holds (see the module docstring)."""

    def __init__(self, threads: int, batch: int, *, sqlite: bool, async_concurrency: int = 100) -> None:
        self.threads = threads
        self.async_concurrency = async_concurrency
        self.batch = batch
        self.sqlite = sqlite
        self.lock = threading.Lock()
        # SimpleQueue: its put is one C call; Queue's took a lock and a
        # Condition notify per job.
        self.work: queue.SimpleQueue[JobRecord] = queue.SimpleQueue()
        """Claimed jobs waiting for an executor (None: an executor's signal to exit)."""
        self.room = threading.Event()
        """Set when jobs leave the pool: the fetcher, waiting while it is full, looks again."""
        self.avg_duration: float | None = None
        """How long a job takes here (a moving average): sizes the prefetch."""
        self._running: dict[int, Slot] = {}
        self._inflight = 0
        self._ids: set[int] = set()
        """The ids of every job held, from its claim until its outcome is
        written or it is given back (the heartbeat's orphans are the others)."""
        self._async_ids: set[int] = set()
        """The held jobs of ``async def`` handlers: counted apart, against
        ``async_concurrency`` (they hold no thread), not in ``_inflight``."""
        self._set_aside: list[SetAside] = []
        """Jobs held but neither run nor acknowledged while the lease is lost."""
        self._cancel_before_start: set[int] = set()
        """Held jobs a cancel reached before their handler started (``cancel_running``)."""

    # -- the count in flight ----------------------------------------------------

    @property
    def inflight(self) -> int:
        with self.lock:
            return self._inflight + len(self._async_ids)

    @property
    def async_inflight(self) -> int:
        """Jobs of ``async def`` handlers held (claimed, not yet acknowledged)."""
        with self.lock:
            return len(self._async_ids)

    def async_room(self) -> int:
        """How many jobs of ``async def`` handlers one claim may take now."""
        with self.lock:
            return max(0, min(self.batch, self.async_concurrency - len(self._async_ids)))

    def capacity(self) -> int:
        """How many jobs to hold: the threads, plus a prefetch sized so the
        held jobs start within about 50 ms (many for tiny jobs, none for slow)."""
        avg = self.avg_duration
        # On SQLite up to two batches: the acker's refill claims a full batch
        # while the last one's acks are written, in the same transaction. On
        # PostgreSQL the fetcher claims on a connection of its own while the
        # acker completes, so it may run ahead: with two batches it waited
        # for each completion to free room, and the two statements took
        # turns instead of overlapping.
        batches = 2 if self.sqlite else 4
        prefetch = 0 if avg is None else int(min(batches * self.batch, self.threads * 0.05 / max(avg, 1e-6)))
        return self.threads + prefetch

    def full(self) -> bool:
        with self.lock:
            return self._inflight >= self.capacity()

    def room_for(self, freed: int = 0) -> int:
        """How many jobs one claim may take now (``freed``: outcomes about to be written)."""
        with self.lock:
            return min(self.batch, self.capacity() - self._inflight + freed)

    def reserve_room(self, freed: int = 0) -> int:
        """Count the room one claim may take now in flight ahead of the claim
        (so the fetcher cannot claim it too) and return it; 0 when there is
        none (``freed``: outcomes about to be written in the same transaction)."""
        with self.lock:
            room = min(self.batch, self.capacity() - self._inflight + freed)
            if room <= 0:
                return 0
            self._inflight += room
            return room

    def claimed(self, jobs: Iterable[JobRecord], reserved: int = 0, on_loop: bool = False) -> None:
        """Hold ``jobs``: ``reserved`` of the count was taken ahead (``reserve``);
        ``on_loop``: jobs of ``async def`` handlers, counted apart."""
        jobs = list(jobs)
        with self.lock:
            if on_loop:
                self._async_ids.update(j.id for j in jobs)
            else:
                self._inflight += len(jobs) - reserved
            self._ids.update(j.id for j in jobs)

    def given_back(self, job_ids: Iterable[int]) -> None:
        """Jobs released unstarted or set aside: no longer held."""
        ids = list(job_ids)
        with self.lock:
            self._inflight -= len(ids) - self._take_async(ids)
            self._ids.difference_update(ids)

    def ended(self, job_ids: Iterable[int], counted: bool = True) -> None:
        """Outcomes written: the jobs are no longer held (``counted``: and no longer in flight;
        a refill that took their room has counted them already, ``thread_held``)."""
        ids = list(job_ids)
        with self.lock:
            on_loop = self._take_async(ids)
            if counted:
                self._inflight -= len(ids) - on_loop
            self._ids.difference_update(ids)
        if on_loop:
            self.room.set()  # room for async jobs: the fetcher claims them (a refill claims for threads only)

    def thread_held(self, job_ids: Iterable[int]) -> int:
        """How many of ``job_ids`` are counted against the threads (not async jobs)."""
        ids = list(job_ids)
        with self.lock:
            if not self._async_ids:
                return len(ids)
            return sum(1 for i in ids if i not in self._async_ids)

    def _take_async(self, ids: list[int]) -> int:
        """Under the lock: take ``ids``' async jobs out of their count; returns how many there were."""
        if not self._async_ids:
            return 0
        before = len(self._async_ids)
        self._async_ids.difference_update(ids)
        return before - len(self._async_ids)

    def unknown(self, held: dict[int, int]) -> dict[int, int]:
        """Of the jobs the database says this worker holds (id -> attempt), those it does not."""
        with self.lock:
            return {job_id: attempt for job_id, attempt in held.items() if job_id not in self._ids}

    # -- the work queue -----------------------------------------------------------

    def queue(self, jobs: Iterable[JobRecord]) -> None:
        for job in jobs:
            self.work.put(job)

    def take_queued(self) -> list[JobRecord]:
        """Take every job waiting for an executor off the work queue (a
        shutdown sentinel stays for the executors)."""
        taken: list[JobRecord] = []
        while True:
            try:
                job = self.work.get_nowait()
            except queue.Empty:
                return taken
            if job is None:
                self.work.put(job)
                return taken
            taken.append(job)

    # -- running ------------------------------------------------------------------

    def begin(self, slot: Slot, lease: Lease) -> bool:
        """Run ``slot``'s job here: False when the lease is lost (its job is
        set aside instead). A cancel that came first is passed on. The lease
        is read under the lock: the lease watch sets aside or cancels under
        it too, so a job is never missed by both."""
        job = slot.job
        with self.lock:
            self._running[job.id] = slot
            if job.id in self._cancel_before_start or job.cancel_requested_at is not None:
                self._cancel_before_start.discard(job.id)
                slot.cancelled.cancel("cancelled")
            if lease.lost:  # claimed before the lease went: another process may run it now
                del self._running[job.id]
                self._set_aside.append(SetAside(job))
                return False
        return True

    def finish(self, slot: Slot, set_aside: bool, took: float | None = None) -> bool:
        """The handler of ``slot`` returned: True when its result is late
        (timed out or released meanwhile) and must be refused. With
        ``set_aside`` (it stopped for a lost lease) the job waits to be given
        back. Otherwise ``took``, the seconds it ran, goes into the average
        that sizes the prefetch (None: not a thread's time). One lock for
        both: each acquisition an executor makes per job is one more chance
        to wait on the acker, which holds it too."""
        with self.lock:
            if slot.abandoned or self._running.get(slot.job.id) is not slot:
                slot.abandoned = True
                return True
            del self._running[slot.job.id]
            if set_aside:
                self._set_aside.append(SetAside(slot.job, slot.started))
            elif took is not None:
                avg = self.avg_duration
                self.avg_duration = took if avg is None else 0.9 * avg + 0.1 * took
            return False

    def expired(self, mono_now: float) -> list[Slot]:
        """Take the slots past their deadline out, marked abandoned."""
        expired: list[Slot] = []
        with self.lock:
            for job_id, slot in list(self._running.items()):
                if slot.deadline is not None and mono_now >= slot.deadline:
                    slot.abandoned = True
                    slot.cancelled.cancel(TIMED_OUT)
                    del self._running[job_id]
                    expired.append(slot)
        return expired

    def all_busy(self, mono_now: float, after: float) -> bool:
        """Every thread has run its job for at least ``after`` seconds; the
        average then counts at least the shortest of them (what the running
        jobs already show about how long jobs take here)."""
        with self.lock:
            ages = [mono_now - s.started_mono for s in self._running.values() if not s.abandoned and not s.on_loop]
            if len(ages) < self.threads or min(ages) < after:
                return False
            self.avg_duration = max(self.avg_duration or 0.0, min(ages))
            return True

    def abandon_running(self) -> list[Slot]:
        """At the end of a stop's grace: every running slot, marked abandoned,
        its handler told (``ctx.cancelled``), and let go."""
        with self.lock:
            leftover = list(self._running.values())
            for s in leftover:
                s.abandoned = True
                s.cancelled.cancel(RELEASED)
            self._running.clear()
        return leftover

    def idle(self) -> bool:
        with self.lock:
            return not self._running

    def running_slots(self) -> list[Slot]:
        with self.lock:
            return list(self._running.values())

    def running_jobs(self) -> list[int]:
        with self.lock:
            return list(self._running)

    def logs_pending(self) -> list[AttemptLog]:
        """The log buffers of the running attempts that have lines to write."""
        with self.lock:
            return [s.log for s in self._running.values() if s.log is not None and s.log.has_pending()]

    def cancel_running(self, job_ids: list[int], held: bool = False, reason: str = "cancelled") -> list[int]:
        """Tell the handlers of these jobs that they were cancelled (set
        their ``ctx.cancelled``, with ``reason``); returns the ids of those running here.
        ``held``: the ids are all of this pool's cancelled jobs (its heartbeat
        said so), so those not started yet are remembered, until the next
        beat, and never start their handler."""
        told: list[int] = []
        with self.lock:
            for job_id in job_ids:
                slot = self._running.get(job_id)
                if slot is not None:
                    slot.cancelled.cancel(reason)
                    told.append(job_id)
            if held:
                self._cancel_before_start = set(job_ids) - set(told)
        return told

    # -- set aside while the lease is lost ----------------------------------------

    def set_aside(self, unstarted: list[JobRecord]) -> list[int]:
        """The lease is lost: ``unstarted`` are set aside; returns the running ids (to be told)."""
        with self.lock:
            self._set_aside.extend(SetAside(job) for job in unstarted)
            return list(self._running)

    def has_set_aside(self) -> bool:
        return bool(self._set_aside)

    def take_set_aside(self) -> list[SetAside]:
        with self.lock:
            aside, self._set_aside = self._set_aside, []
        return aside

    def keep_set_aside(self, aside: list[SetAside]) -> None:
        """Giving ``aside`` back failed: keep them for the next try, first."""
        with self.lock:
            self._set_aside = aside + self._set_aside
