"""The embedded worker pool: N handler threads fed by one claiming thread.

One fetcher claims due jobs in batches (as many as the pool can start soon),
N executor threads run handlers, one acker writes completions and failures in
batches, and one monitor heart-beats the held jobs and enforces timeouts.
Every loop waits on an event, so ``stop`` is prompt; each loop body is a
``*_once`` method that tests can call directly.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from app.handlers import JobContext
from app.service import Jobdeck
from app.store import JobRecord, Outcome

log = logging.getLogger("jobdeck.worker")
T = TypeVar("T")


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class _Slot:
    job: JobRecord
    started: datetime
    started_mono: float
    deadline: float | None
    thread: threading.Thread
    abandoned: bool = field(default=False)


class WorkerPool:
    def __init__(
        self,
        deck: Jobdeck,
        threads: int | None = None,
        *,
        worker_id: str | None = None,
        batch: int | None = None,
        poll_interval: float | None = None,
        heartbeat_interval: float | None = None,
        queues: list[str] | None = None,
    ) -> None:
        cfg = deck.config
        self.deck = deck
        self.store = deck.store
        self.threads = cfg.workers if threads is None else threads
        self.worker_id = worker_id or new_worker_id()
        self.batch = batch or cfg.claim_batch
        self.poll_interval = poll_interval or cfg.poll_interval
        self.heartbeat_interval = heartbeat_interval or cfg.heartbeat_interval
        self.queues = queues

        self._work: queue.Queue[JobRecord] = queue.Queue()
        self._acks: queue.Queue[Outcome] = queue.Queue()
        self._lock = threading.Lock()
        self._running: dict[int, _Slot] = {}
        self._inflight = 0
        self._avg_duration: float | None = None
        self._wake = threading.Event()
        self._room = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._acker_stop = threading.Event()
        self._hurry = threading.Event()
        """Set by ``hurry``: ``stop`` ends its grace now."""
        self._refill_lock = threading.Lock()
        """Held by the acker from a refill's claim until its jobs are queued;
        ``stop`` takes it before releasing unstarted jobs (see ``flush_acks_once``)."""
        self._threads: list[threading.Thread] = []
        self._executors: list[threading.Thread] = []
        self._started = False
        self.store.on_enqueue(self.wake)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError("worker pool already started")
        self._started = True
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), self.threads, self.deck.clock()
        )
        for name, target in (("fetcher", self._fetch_loop), ("acker", self._ack_loop), ("monitor", self._monitor_loop)):
            t = threading.Thread(target=target, name=f"jobdeck-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        for _ in range(self.threads):
            self._spawn_executor()
        log.info("worker pool %s started with %d threads", self.worker_id, self.threads)

    def wake(self) -> None:
        """Something was enqueued in this process: claim now, not at the next poll."""
        self._wake.set()

    def hurry(self) -> None:
        """End a ``stop``'s grace now (a second shutdown signal): what is
        still running is released at once. Only sets an event, so any
        thread may call it."""
        self._hurry.set()

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming, let running jobs finish for up to ``grace`` seconds
        (or until ``hurry``), then release what is left back to ``pending``
        with no retry counted: each started one keeps an attempt row saying
        shutdown interrupted it."""
        if not self._started or self._stopped.is_set():
            return
        grace = self.deck.config.shutdown_grace if grace is None else grace
        self._stopping.set()
        self._wake.set()
        self._room.set()
        for t in self._threads[:1]:  # the fetcher: nothing new is claimed after it exits
            t.join(timeout=30)
        with self._refill_lock:  # an acker refill in flight has queued its jobs; none starts now
            self._release_unstarted()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not self._hurry.is_set():
            with self._lock:
                if not self._running:
                    break
            self._room.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            self._room.clear()
        with self._lock:
            leftover = [s for s in self._running.values()]
            for s in leftover:
                s.abandoned = True
            self._running.clear()
        for _ in self._executors:
            self._work.put(None)  # type: ignore[arg-type]  # wakes executors so they exit
        self._acker_stop.set()
        for t in self._threads[1:]:
            t.join(timeout=30)
        self.flush_acks_once()
        if leftover:
            held = [(s.job.id, s.job.attempt) for s in leftover]
            started = {s.job.id: s.started for s in leftover}
            released = self._retrying(
                lambda: self.store.release(self.worker_id, held, self.deck.clock(), interrupted=started)
            )
            log.warning("released %d running jobs at shutdown: %s", len(released), released)
        self._retrying(lambda: self.store.stop_worker(self.worker_id, self.deck.clock()))
        self._stopped.set()
        log.info("worker pool %s stopped", self.worker_id)

    def _release_unstarted(self) -> None:
        unstarted: list[JobRecord] = []
        while True:
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                unstarted.append(job)
        if unstarted:
            with self._lock:
                self._inflight -= len(unstarted)
            held = [(j.id, j.attempt) for j in unstarted]
            self._retrying(lambda: self.store.release(self.worker_id, held, self.deck.clock()))

    # -- fetching -------------------------------------------------------------

    def _capacity(self) -> int:
        """How many jobs to hold: the threads, plus a prefetch sized so the
        held jobs start within about 50 ms (many for tiny jobs, none for slow)."""
        avg = self._avg_duration
        # Up to two batches: the next claim is a full batch while the last
        # one's acks are still being written (halves the transactions per job).
        prefetch = 0 if avg is None else int(min(2 * self.batch, self.threads * 0.05 / max(avg, 1e-6)))
        return self.threads + prefetch

    def fetch_once(self, now: datetime | None = None) -> int:
        """Claim as many due jobs as there is room for; returns how many."""
        types = self.deck.registry.names()
        if not types:
            return 0
        with self._lock:
            room = min(self.batch, self._capacity() - self._inflight)
        if room <= 0:
            return 0
        claimed = self.store.claim(
            self.worker_id, now or self.deck.clock(), limit=room, types=types, queues=self.queues
        )
        if claimed:
            with self._lock:
                self._inflight += len(claimed)
            for job in claimed:
                self._work.put(job)
        return len(claimed)

    def _fetch_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            with self._lock:
                full = self._inflight >= self._capacity()
            if full:
                self._room.wait(timeout=self.poll_interval)
                self._room.clear()
                continue
            self._wake.clear()
            try:
                got = self.fetch_once()
                failures = 0
            except (OperationalError, DBAPIError) as exc:
                failures += 1
                log.warning("claim failed (%s); retrying", exc.__class__.__name__, exc_info=failures == 1)
                self._stopping.wait(min(5.0, 0.1 * 2**failures))
                continue
            except Exception:
                # A bug, not an outage: say so loudly, but keep the pool claiming.
                failures += 1
                log.exception("claim failed unexpectedly; retrying")
                self._stopping.wait(min(5.0, 0.1 * 2**failures))
                continue
            if got == 0:
                self._wake.wait(timeout=self.poll_interval)

    # -- executing ------------------------------------------------------------

    def _spawn_executor(self) -> None:
        t = threading.Thread(target=self._execute_loop, name="jobdeck-executor", daemon=True)
        self._executors.append(t)
        t.start()

    def _execute_loop(self) -> None:
        me = threading.current_thread()
        while True:
            job = self._work.get()
            if job is None:
                return
            slot = self.run_job(job, me)
            if slot.abandoned:
                return  # a replacement thread took this one's place

    def run_job(self, job: JobRecord, thread: threading.Thread | None = None) -> _Slot:
        """Run one claimed job's handler and queue its outcome for the acker."""
        spec = self.deck.registry.get(job.type)
        started = self.deck.clock()
        mono = time.monotonic()
        timeout = spec.timeout if spec else None
        slot = _Slot(job, started, mono, mono + timeout if timeout else None, thread or threading.current_thread())
        with self._lock:
            self._running[job.id] = slot
        outcome = Outcome(job.id, self.worker_id, attempt=job.attempt, started_at=started)
        try:
            if spec is None:
                raise LookupError(f"no handler registered for {job.type!r} in this process")
            ctx = JobContext(self.store, job.id, job.attempt, self.worker_id, job.type, self.deck.clock)
            outcome.result = spec.fn(job.payload, ctx)
        except Exception as exc:
            outcome.error = _first_line(exc)
            outcome.traceback = traceback.format_exc()
            outcome.retryable = spec is not None
        elapsed = time.monotonic() - mono
        with self._lock:
            if slot.abandoned or self._running.get(job.id) is not slot:
                log.warning("late result of job %s attempt %s refused (timed out or released)", job.id, job.attempt)
                slot.abandoned = True
                return slot
            del self._running[job.id]
            self._avg_duration = elapsed if self._avg_duration is None else 0.9 * self._avg_duration + 0.1 * elapsed
        if outcome.result is not None and not _jsonable(outcome.result):
            outcome.result = repr(outcome.result)
        self._acks.put(outcome)
        return slot

    # -- acknowledging ----------------------------------------------------------

    def flush_acks_once(self, now: datetime | None = None, refill: bool = False) -> int:
        """Write every queued outcome: completions in one statement, failures
        by the fail rule, all in as few transactions as possible.

        With ``refill`` (the ack loop) the completions' transaction also
        claims jobs for the room they free (``Store.complete_and_claim``):
        one commit instead of an ack's and a claim's, and the fetcher, which
        then finds the pool full, only claims at start-up and when idle."""
        batch: list[Outcome] = []
        while True:
            try:
                batch.append(self._acks.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return 0
        now = now or self.deck.clock()
        done = [o for o in batch if o.ok]
        failed = [o for o in batch if not o.ok]
        if failed:
            self._retrying(lambda: self.store.fail_many(failed, now))
        refilled = self._complete_and_refill(done, len(batch), now) if done and refill else None
        if done and refilled is None:
            self._retrying(lambda: self.store.complete_many(done, now))
        if refilled is None:
            with self._lock:
                self._inflight -= len(batch)
        if not refilled:  # no refill, or one that found less than the room: the fetcher looks
            self._room.set()
        return len(batch)

    def _complete_and_refill(self, done: list[Outcome], acked: int, now: datetime) -> bool | None:
        """Complete ``done`` and claim into the room the ``acked`` outcomes
        free, in one transaction; queue the claimed jobs. Returns None when
        it did nothing (stopping, no types, no room), else whether the room
        was filled. The room is reserved in ``_inflight`` while the claim
        runs, so the fetcher cannot claim it too."""
        types = self.deck.registry.names()
        with self._refill_lock:
            if self._stopping.is_set() or not types:
                return None
            with self._lock:
                room = min(self.batch, self._capacity() - self._inflight + acked)
                if room <= 0:
                    return None
                self._inflight += room
            claimed: list[JobRecord] = []
            try:
                _, claimed = self._retrying(
                    lambda: self.store.complete_and_claim(
                        done, self.worker_id, now, limit=room, types=types, queues=self.queues
                    )
                )
            finally:
                with self._lock:
                    self._inflight += len(claimed) - room - acked
            for job in claimed:
                self._work.put(job)
        return len(claimed) >= room

    def _ack_loop(self) -> None:
        while not self._acker_stop.is_set():
            try:
                first = self._acks.get(timeout=0.2)
            except queue.Empty:
                continue
            self._acks.put(first)
            try:
                self.flush_acks_once(refill=True)
            except Exception:
                # Database errors are retried inside; anything else is a bug.
                # Keep acknowledging later outcomes: the jobs of the lost batch
                # stay running under this worker and are rescued as stalled
                # once this process stops heart-beating them.
                log.exception("acknowledging a batch of outcomes failed")
                self._acker_stop.wait(1.0)

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Run a store write until it succeeds: an outcome is never dropped
        because the database was briefly unreachable."""
        delay = 0.05
        while True:
            try:
                return fn()
            except (OperationalError, DBAPIError) as exc:
                log.warning("database write failed (%s); retrying in %.2fs", exc.__class__.__name__, delay)
                time.sleep(delay)  # backoff between retries of one write; nothing to wake for
                delay = min(5.0, delay * 2)

    # -- monitoring -------------------------------------------------------------

    def check_timeouts_once(self, mono_now: float | None = None) -> list[int]:
        """Fail attempts that ran past their type's timeout and give their
        thread's place to a new one; the late result will be refused."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        expired: list[_Slot] = []
        with self._lock:
            for job_id, slot in list(self._running.items()):
                if slot.deadline is not None and mono_now >= slot.deadline:
                    slot.abandoned = True
                    del self._running[job_id]
                    expired.append(slot)
        for slot in expired:
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

    def heartbeat_once(self, now: datetime | None = None) -> int:
        """Beat for every held job and for the worker; without ``now`` the
        time is read once the store's write lock is held."""
        return self.store.heartbeat_worker(self.worker_id, now or self.deck.clock)

    SHED_AFTER = 0.25
    """Seconds every thread must have been busy before prefetched jobs are shed."""

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
        shed: list[JobRecord] = []
        while True:
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                break
            if job is None:  # a shutdown sentinel: leave it for the executors
                self._work.put(job)
                break
            shed.append(job)
        if not shed:
            return []
        held = [(j.id, j.attempt) for j in shed]
        released = self._retrying(lambda: self.store.release(self.worker_id, held, self.deck.clock()))
        with self._lock:
            self._inflight -= len(shed)
        log.info("shed %d prefetched jobs while all %d threads run slow jobs", len(released), self.threads)
        return released

    def _monitor_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_interval
        while not self._acker_stop.wait(0.1):
            self.check_timeouts_once()
            try:
                self.shed_once()
            except (OperationalError, DBAPIError) as exc:
                log.warning("shedding prefetched jobs failed: %s", exc.__class__.__name__)
            if time.monotonic() >= next_beat:
                try:
                    self.heartbeat_once()
                except (OperationalError, DBAPIError) as exc:
                    log.warning("heartbeat failed: %s", exc.__class__.__name__)
                next_beat = time.monotonic() + self.heartbeat_interval

    # -- introspection --------------------------------------------------------

    def running_jobs(self) -> list[int]:
        with self._lock:
            return list(self._running)

    @property
    def inflight(self) -> int:
        with self._lock:
            return self._inflight


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _jsonable(value: object) -> bool:
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
