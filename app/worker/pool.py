"""The embedded worker pool: N handler threads fed by one claiming thread.

One fetcher claims due jobs in batches (as many as the pool can start soon),
N executor threads run handlers, one acker writes completions and failures in
batches, and one monitor heart-beats the held jobs and enforces timeouts.
Every loop waits on an event, so ``stop`` is prompt; each loop body is a
``*_once`` method that tests can call directly.

This module holds the lifecycle, the fetcher and the executors; the acker is
``jobdeck.worker.acks``, the monitor ``jobdeck.worker.monitor``, and the state they
share ``jobdeck.worker.shared``.
"""

from __future__ import annotations

import inspect
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from jobdeck import health
from jobdeck.core import forks
from jobdeck.core.clock import since_boot
from jobdeck.core.config import non_retryable
from jobdeck.core.crashpoints import crash_point
from jobdeck.core.errors import Cancelled, DeadLetter
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext
from jobdeck.jobs.snooze import InvalidSnooze, Snooze, max_snoozes, seconds_of
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.faults import is_transient
from jobdeck.worker.acks import Acknowledging
from jobdeck.worker.lease import LEASE_LOST, Lease, SetAside
from jobdeck.worker.leasing import Leasing
from jobdeck.worker.monitor import Monitoring
from jobdeck.worker.results import awaited, first_line, format_traceback, storable_result
from jobdeck.worker.shared import RETRY_CAP, STOP_MARGIN, Slot, log
from jobdeck.worker.spool import AckSpool

__all__ = ["RETRY_CAP", "STOP_MARGIN", "WorkerPool", "new_worker_id"]


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def not_retried_note(exc: BaseException, job: JobRecord) -> str:
    """The last line of the error of an attempt sent to dead by an error no
    retry can fix while retries were left, so the job's page says why they
    went unused. Nothing when none were left (dead either way) or for a
    ``DeadLetter``, whose handler chose dead and says so in its own words.
    The fingerprint reads the first line only: the groups stay as they were."""
    if isinstance(exc, DeadLetter) or job.retry_count >= job.max_retries:
        return ""
    return f"\n(not retried: {type(exc).__name__} is non-retryable)"


class WorkerPool(Acknowledging, Monitoring, Leasing):
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
        on_unhealthy: Callable[[str], None] | None = None,
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
        self.max_abandoned_threads = cfg.max_abandoned_threads
        self.max_result_bytes = cfg.max_result_bytes
        self.on_unhealthy = on_unhealthy
        """Called once, from the monitor thread, when the pool turns unhealthy
        (``jobdeck.runtime`` uses it for ``exit_when_unhealthy``)."""

        # SimpleQueue: its put is one C call; Queue's took a lock and a
        # Condition notify per job, a seventh of the PostgreSQL drain's Python time.
        self._work: queue.SimpleQueue[JobRecord] = queue.SimpleQueue()
        self._acks: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[int, Slot] = {}
        self._inflight = 0
        self._avg_duration: float | None = None
        self._wake = threading.Event()
        self._room = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._acker_stop = threading.Event()
        self._hurry = threading.Event()
        """Set by ``hurry``: ``stop`` ends its grace now."""
        self._held: list[JobRecord] = []
        self._refill_lock = threading.Lock()
        """Held by the acker from a refill's claim until its jobs are queued;
        ``stop`` takes it before releasing unstarted jobs (see ``flush_acks_once``)."""
        self._threads: list[threading.Thread] = []
        self._executors: list[threading.Thread] = []
        self._abandoned: list[threading.Thread] = []
        """Threads left running a handler past its timeout (see ``check_timeouts_once``)."""
        self._reported_health: tuple[int, str | None] = (0, None)
        self._told_unhealthy = False
        self._give_up_at: float | None = None
        """Set by ``stop``: past it, ``_retrying`` stops retrying."""
        self._cancel_before_start: set[int] = set()
        """Held jobs a cancel reached before their handler started (``cancel_running``)."""
        self.lease = Lease(cfg.stall_timeout)
        self._set_aside: list[SetAside] = []
        self._holding: set[int] = set()
        self._suspects: dict[int, int] = {}
        self.write_outage = None
        self._unlanded = {}
        self._spool_folder = Path(cfg.instance_path) / "acks"
        self._spool = None
        self._started = False
        self.store.on_enqueue(self.wake)
        self.store.on_cancel(self.cancel_running)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError("worker pool already started")
        self._started = True
        forks.pool_started()
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), self.threads, self.deck.clock(), queues=self.queues
        )
        self._reserve_spool()
        self.lease.renew(since_boot())  # registering stamped the worker's row
        loops = (
            ("fetcher", self._fetch_loop), ("acker", self._ack_loop), ("monitor", self._monitor_loop),
            ("heartbeat", self._heartbeat_loop), ("lease", self._lease_watch_loop),
        )  # fmt: skip
        for name, target in loops:
            t = threading.Thread(target=target, name=f"jobdeck-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        for _ in range(self.threads):
            self._spawn_executor()
        health.register(self.deck, self.unhealthy_reason)
        log.info("worker pool %s started with %d threads", self.worker_id, self.threads,
                 extra={"event": "worker.started", "worker_id": self.worker_id, "threads": self.threads})  # fmt: skip

    def _reserve_spool(self) -> None:
        """Reserve the file for outcomes that never land (``jobdeck.worker.spool``)
        and write what stopped pools on this host kept, once: the acker
        retries if the database refuses now."""
        spool = AckSpool(self._spool_folder, self.worker_id)
        try:
            spool.reserve()
            self._spool = spool
        except OSError as exc:
            log.warning("no room reserved for outcomes that may not land at shutdown (%s): "
                        "they would be logged and their jobs rescued", exc)  # fmt: skip
        try:
            self.adopt_kept_once(retry=False)
        except Exception as exc:
            log.warning("writing outcomes kept by stopped pools failed (%s); retrying", first_line(exc))

    def wake(self) -> None:
        """Something was enqueued in this process: claim now, not at the next poll."""
        self._wake.set()

    def hurry(self) -> None:
        """End a ``stop``'s grace now (a second shutdown signal): what is
        still running is released at once, and writes that meet an outage
        are no longer retried (what did not land is kept, ``keep_unlanded``).
        Only sets an event and a deadline, so any thread may call it."""
        self._hurry.set()
        if self._give_up_at is not None:
            self._give_up_at = min(self._give_up_at, time.monotonic())

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming, let running jobs finish for up to ``grace`` seconds
        (or until ``hurry``), then release what is left back to ``pending``
        with no retry counted: each started one keeps an attempt row saying
        shutdown interrupted it."""
        if not self._started or self._stopped.is_set():
            return
        grace = self.deck.config.shutdown_grace if grace is None else grace
        # Every wait and retry below ends by then, database or not.
        self._give_up_at = time.monotonic() + grace + STOP_MARGIN
        self._stopping.set()
        self._wake.set()
        self._room.set()
        for t in self._threads[:1]:  # the fetcher: nothing new is claimed after it exits
            t.join(timeout=self._time_left())
        with self._refill_lock:  # an acker refill in flight has queued its jobs; none starts now
            try:
                self._release_unstarted()
            except Exception as exc:  # the database is down past the deadline: the sweep rescues them
                log.error("releasing unstarted jobs at shutdown failed (%s)", first_line(exc))
        deadline = min(time.monotonic() + grace, self._give_up_at)
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
            t.join(timeout=self._time_left())
        try:
            self.flush_acks_once()
            if leftover:
                self.flush_slots(leftover)
                held = [(s.job.id, s.job.attempt) for s in leftover]
                started = {s.job.id: s.started for s in leftover}
                released = self._retrying(
                    lambda: self.store.release(self.worker_id, held, self.deck.clock(), interrupted=started)
                )
                log.warning("released %d running jobs at shutdown: %s", len(released), released)
            if self._set_aside and not self.lease.lost:  # one try; if it fails, the stalled sweep takes them
                self._release_set_aside()
            self._retrying(lambda: self.store.stop_worker(self.worker_id, self.deck.clock()))
        except Exception as exc:
            # The database stayed unreachable past the grace: what could not
            # be written stays running under this worker, and the stalled
            # sweep of any process rescues it once the heartbeats have stopped.
            log.error("worker pool %s stopped without writing its last state (%s)", self.worker_id, first_line(exc))
        self.keep_unlanded()
        health.unregister(self.deck, self.unhealthy_reason)
        forks.pool_stopped()
        self._stopped.set()
        log.info(
            "worker pool %s stopped", self.worker_id, extra={"event": "worker.stopped", "worker_id": self.worker_id}
        )

    def _time_left(self) -> float:
        return 30.0 if self._give_up_at is None else max(0.0, self._give_up_at - time.monotonic())

    def _release_unstarted(self) -> None:
        """Under ``_refill_lock``: give back the jobs queued or held for the executors."""
        unstarted, self._held = self._held, []
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
                self._holding.difference_update(j.id for j in unstarted)
            held = [(j.id, j.attempt) for j in unstarted]
            self._retrying(lambda: self.store.release(self.worker_id, held, self.deck.clock()))

    # -- fetching -------------------------------------------------------------

    def fetch_once(self, now: datetime | None = None) -> int:
        """Claim as many due jobs as there is room for; returns how many."""
        types = self.deck.registry.names()
        if not types or self.lease.lost or self.unhealthy_reason() is not None or self.write_outage is not None:
            return 0  # a pool that cannot acknowledge takes no new jobs
        with self._lock:
            room = min(self.batch, self._capacity() - self._inflight)
        if room <= 0:
            return 0
        claimed = self.store.claim(
            self.worker_id, now or self.deck.clock(), limit=room, types=types, queues=self.queues
        )
        if claimed:
            crash_point("claim")
            with self._lock:
                self._inflight += len(claimed)
                self._holding.update(j.id for j in claimed)
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
            except Exception as exc:
                failures += 1
                if is_transient(exc):
                    log.warning("claim failed (%s); retrying", exc.__class__.__name__, exc_info=failures == 1)
                else:
                    # A bug, not an outage: say so loudly, but keep the pool claiming.
                    log.exception("claim failed unexpectedly; retrying")
                # An enqueue in this process (or a NOTIFY) means the database
                # is back: claim at once instead of sleeping out the backoff.
                self._wake.wait(min(RETRY_CAP, 0.1 * 2**failures))
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

    def run_job(self, job: JobRecord, thread: threading.Thread | None = None) -> Slot:
        """Run one claimed job's handler and queue its outcome for the acker."""
        spec = self.deck.registry.get(job.type)
        started = self.deck.clock()
        mono = time.monotonic()
        timeout = spec.timeout if spec else None
        slot = Slot(job, started, mono, mono + timeout if timeout else None, thread or threading.current_thread())
        slot.log = buffer = self.new_log(job)
        with self._lock:
            self._running[job.id] = slot
            if job.id in self._cancel_before_start or job.cancel_requested_at is not None:
                self._cancel_before_start.discard(job.id)
                slot.cancelled.cancel("cancelled")
            if self.lease.lost:  # claimed before the lease went: another process may run it now
                del self._running[job.id]
                self._set_aside.append(SetAside(job))
                return slot
        outcome = Outcome(job.id, self.worker_id, attempt=job.attempt, started_at=started)
        try:
            if spec is None:
                raise LookupError(f"no handler registered for {job.type!r} in this process")
            if slot.cancelled.is_set():
                raise Cancelled(job.id)  # cancelled while it waited here: the handler never starts
            ctx = JobContext(
                self.store, job.id, job.attempt, self.worker_id, job.type, self.deck.clock,
                cancelled=slot.cancelled, log=buffer,
            )  # fmt: skip
            with self.capturing(job, buffer):
                result = spec.fn(job.payload, ctx)
                if inspect.isawaitable(result):  # an ``async def`` handler
                    result = awaited(result)
            if forks.forked:  # a child the handler forked returned here: it is no executor
                forks.leave(0, f"the end of job {job.id}'s handler")
            if isinstance(result, Snooze):
                raise result  # returned or raised, one path
            outcome.result = storable_result(result, self.max_result_bytes)
        except BaseException as exc:
            # SystemExit and KeyboardInterrupt from a handler (sys.exit() in
            # library code, a stray raise) are the handler's failure like any
            # other: letting them through killed this thread and left the job
            # running forever. The pool stops its executors with a sentinel,
            # never by raising into them, so nothing here is the pool's own.
            if forks.forked:
                forks.leave(forks.exit_status(exc), f"the end of job {job.id}'s handler")
            failure: BaseException | None = exc
            if isinstance(exc, Snooze) and spec is not None:
                failure = self._snoozed(outcome, exc, job.type)
            if failure is not None:
                outcome.error = first_line(failure)
                outcome.traceback = format_traceback()
                outcome.retryable = spec is not None and spec.retries(
                    failure, non_retryable(self.deck.config, job.type)
                )
                if spec is not None and not outcome.retryable:
                    outcome.error += not_retried_note(failure, job)
        elapsed = time.monotonic() - mono
        stopped_for_lease = outcome.error is not None and slot.cancelled.reason == LEASE_LOST
        with self._lock:
            late = slot.abandoned or self._running.get(job.id) is not slot
            if late:
                slot.abandoned = True
            else:
                del self._running[job.id]
                if stopped_for_lease:  # not a failure: given back once the lease is held again
                    self._set_aside.append(SetAside(job, started))
        if stopped_for_lease and not late:
            self.flush_log(buffer)
            return slot
        if late:
            log.warning("late result of job %s attempt %s refused (timed out or released)", job.id, job.attempt)
            self.flush_log(buffer)  # its lines are still the attempt's
            return slot
        with self._lock:
            self._avg_duration = elapsed if self._avg_duration is None else 0.9 * self._avg_duration + 0.1 * elapsed
        if buffer.has_pending():  # the acker writes it before the outcome, one transaction per batch
            outcome.log = buffer
        self._acks.put(outcome)
        return slot

    def _snoozed(self, outcome: Outcome, snooze: Snooze, job_type: str) -> InvalidSnooze | None:
        """Make ``outcome`` the snooze the handler asked for (any ``Snooze``,
        subclasses included); a bad delay is returned as the failure."""
        try:
            outcome.snooze, outcome.snooze_reason = seconds_of(snooze)
        except InvalidSnooze as bad:
            return bad
        outcome.max_snoozes = max_snoozes(self.deck.config, self.deck.registry, job_type)
        return None

    # -- introspection --------------------------------------------------------

    def running_jobs(self) -> list[int]:
        with self._lock:
            return list(self._running)

    @property
    def inflight(self) -> int:
        with self._lock:
            return self._inflight
