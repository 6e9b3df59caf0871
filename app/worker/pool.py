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
from functools import partial
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from app import health
from app.crashpoints import crash_point
from app.deck import Jobdeck
from app.errors import DeadLetter
from app.handlers import JobContext
from app.store import JobRecord, Outcome
from app.store.faults import is_transient, storable_text

log = logging.getLogger("jobdeck.worker")
T = TypeVar("T")

STOP_MARGIN = 2.0
"""Seconds beyond ``shutdown_grace`` that ``stop`` keeps retrying its final
writes while the database is unreachable; then it gives up (the jobs it
could not write stay ``running`` until the stalled sweep rescues them)."""

RETRY_CAP = 1.0
"""Longest pause between retries of a write (or a claim) during an outage:
once the database is back, work resumes within about this long."""


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
        self.on_unhealthy = on_unhealthy
        """Called once, from the monitor thread, when the pool turns unhealthy
        (``app.runtime`` uses it for ``exit_when_unhealthy``)."""

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
        self._abandoned: list[threading.Thread] = []
        """Threads left running a handler past its timeout (see ``check_timeouts_once``)."""
        self._reported_health: tuple[int, str | None] = (0, None)
        self._told_unhealthy = False
        self._give_up_at: float | None = None
        """Set by ``stop``: past it, ``_retrying`` stops retrying."""
        self._started = False
        self.store.on_enqueue(self.wake)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError("worker pool already started")
        self._started = True
        self.store.register_worker(self.worker_id, socket.gethostname(), os.getpid(), self.threads, self.deck.clock())
        for name, target in (("fetcher", self._fetch_loop), ("acker", self._ack_loop), ("monitor", self._monitor_loop)):
            t = threading.Thread(target=target, name=f"jobdeck-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        for _ in range(self.threads):
            self._spawn_executor()
        health.register(self.deck, self.unhealthy_reason)
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
                log.error("releasing unstarted jobs at shutdown failed (%s)", _first_line(exc))
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
                held = [(s.job.id, s.job.attempt) for s in leftover]
                started = {s.job.id: s.started for s in leftover}
                released = self._retrying(
                    lambda: self.store.release(self.worker_id, held, self.deck.clock(), interrupted=started)
                )
                log.warning("released %d running jobs at shutdown: %s", len(released), released)
            self._retrying(lambda: self.store.stop_worker(self.worker_id, self.deck.clock()))
        except Exception as exc:
            # The database stayed unreachable past the grace: what could not
            # be written stays running under this worker, and the stalled
            # sweep of any process rescues it once the heartbeats have stopped.
            log.error("worker pool %s stopped without writing its last state (%s)", self.worker_id, _first_line(exc))
        health.unregister(self.deck, self.unhealthy_reason)
        self._stopped.set()
        log.info("worker pool %s stopped", self.worker_id)

    def _time_left(self) -> float:
        return 30.0 if self._give_up_at is None else max(0.0, self._give_up_at - time.monotonic())

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
        if not types or self.unhealthy_reason() is not None:
            return 0
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
        except BaseException as exc:
            # SystemExit and KeyboardInterrupt from a handler (sys.exit() in
            # library code, a stray raise) are the handler's failure like any
            # other: letting them through killed this thread and left the job
            # running forever. The pool stops its executors with a sentinel,
            # never by raising into them, so nothing here is the pool's own.
            outcome.error = _first_line(exc)
            outcome.traceback = _format_traceback()
            outcome.retryable = spec is not None and not isinstance(exc, DeadLetter)
        elapsed = time.monotonic() - mono
        with self._lock:
            if slot.abandoned or self._running.get(job.id) is not slot:
                log.warning("late result of job %s attempt %s refused (timed out or released)", job.id, job.attempt)
                slot.abandoned = True
                return slot
            del self._running[job.id]
            self._avg_duration = elapsed if self._avg_duration is None else 0.9 * self._avg_duration + 0.1 * elapsed
        if outcome.result is not None and not _jsonable(outcome.result):
            outcome.result = _safe_repr(outcome.result)
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
            self._acknowledge(failed, lambda group: self.store.fail_many(group, now), now)
        refilled = self._complete_and_refill(done, len(batch), now) if done and refill else None
        if done and refilled is None:
            self._acknowledge(done, lambda group: self.store.complete_many(group, now), now)
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
            if self._stopping.is_set() or not types or self.unhealthy_reason() is not None:
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
            except Exception as exc:
                if is_transient(exc):  # still down at the end of shutdown's grace
                    raise
                # One outcome the database refuses must not hold the others:
                # complete them one by one, without the refill.
                log.warning("acknowledging %d completions failed (%s); one by one", len(done), _first_line(exc))
                self._one_by_one(done, lambda group: self.store.complete_many(group, now), now)
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

    def _acknowledge(self, outcomes: list[Outcome], write: Callable[[list[Outcome]], object], now: datetime) -> None:
        """Write ``outcomes`` in one batch; if the database refuses the batch
        (not an outage: a value it cannot store, a bug), write them one by
        one, so one bad row cannot hold the others."""
        try:
            self._retrying(lambda: write(outcomes))
        except Exception as exc:
            if is_transient(exc):  # still down at the end of shutdown's grace
                raise
            log.warning("acknowledging %d outcomes failed (%s); one by one", len(outcomes), _first_line(exc))
            self._one_by_one(outcomes, write, now)

    def _one_by_one(self, outcomes: list[Outcome], write: Callable[[list[Outcome]], object], now: datetime) -> None:
        for o in outcomes:
            try:
                self._retrying(partial(write, [o]))
            except Exception as exc:
                if is_transient(exc):
                    raise
                self._record_unstorable(o, exc, now)

    def _record_unstorable(self, o: Outcome, exc: Exception, now: datetime) -> None:
        """The database refused this outcome as it is: record the attempt as
        failed, saying why, with only values every backend stores (the fail
        rule then retries the job or dead-letters it, as for any failure)."""
        why = storable_text(f"the outcome of this attempt could not be stored: {_first_line(exc)}") or ""
        if o.error is not None:
            why = f"{storable_text(o.error)} ({why})"
        failure = Outcome(
            o.job_id, o.worker_id, attempt=o.attempt, started_at=o.started_at, error=why[:2000],
            traceback=storable_text(o.traceback), retryable=o.retryable,
            kind=o.kind if o.error is not None else "failed",
        )  # fmt: skip
        try:
            self._retrying(lambda: self.store.fail_many([failure], now))
        except Exception as again:
            if is_transient(again):
                raise
            log.exception(
                "job %s attempt %s: its outcome could not be stored (%s), nor its failure; "
                "it stays running under %s until this process stops",
                o.job_id, o.attempt, why, self.worker_id,
            )  # fmt: skip

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Run a store write until it succeeds, retrying only what can
        succeed on a later try (``app.store.faults.is_transient``): an outcome is
        never dropped because the database was briefly unreachable, and an
        error that can never succeed (a value the database refuses) is
        raised at once instead of wedging the pool. While stopping, retries
        end at the stop's deadline (``shutdown_grace`` + ``STOP_MARGIN``)."""
        delay = 0.05
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                give_up = self._give_up_at
                if give_up is not None and time.monotonic() + delay > give_up:
                    log.error("database write failed (%s) while stopping; giving up", exc.__class__.__name__)
                    raise
                log.warning("database write failed (%s); retrying in %.2fs", exc.__class__.__name__, delay)
                time.sleep(delay)  # backoff between retries of one write; nothing to wake for
                delay = min(RETRY_CAP, delay * 2)

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
                    if slot.thread is not threading.current_thread():
                        self._abandoned.append(slot.thread)
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
        log.info("shed %d prefetched jobs while all %d threads run slow jobs", len(released), self.threads)
        return released

    def _monitor_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_interval
        while not self._acker_stop.wait(0.1):
            self.check_timeouts_once()
            try:
                self.health_once()
            except Exception as exc:
                log.warning("recording the pool's health failed: %s", _first_line(exc))
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

    # -- health -----------------------------------------------------------------

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
            unstarted = self._take_queued()
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
        log.warning("unhealthy: gave %d claimed, unstarted jobs back", len(released))

    # -- introspection --------------------------------------------------------

    def running_jobs(self) -> list[int]:
        with self._lock:
            return list(self._running)

    @property
    def inflight(self) -> int:
        with self._lock:
            return self._inflight


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # a handler's exception whose __str__ itself raises
        text = "<unprintable>"
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _format_traceback() -> str | None:
    try:
        return traceback.format_exc()
    except Exception:
        return None


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


def _jsonable(value: object) -> bool:
    """Whether a handler's result can be stored and served as strict JSON:
    NaN or Infinity would be stored and sent back as JSON that strict clients
    refuse, like the API refuses them in a payload."""
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True
