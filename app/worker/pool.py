"""The embedded worker pool: N handler threads fed by one claiming thread.

One fetcher claims due jobs in batches (as many as the pool can start soon),
N executor threads run handlers, one acker writes completions and failures in
batches, one monitor enforces timeouts and health, and the heartbeats keep
the pool's lease on its jobs. Every loop waits on an event, so ``stop`` is
prompt; each loop body is a ``*_once`` method that tests can call directly.

The pool holds its parts, each with its own state: ``holdings`` (the jobs it
holds, ``jobdeck.worker.holdings``), ``writes`` (retried writes,
``jobdeck.worker.writes``), ``logs`` (``jobdeck.worker.logs``), ``acker``
(``jobdeck.worker.acks``), ``executors`` (``jobdeck.worker.executors``),
``monitor`` (``jobdeck.worker.monitor``) and ``heart`` (heartbeats and the
lease, ``jobdeck.worker.leasing``). This module holds the lifecycle and the
fetcher. Jobs of ``async def`` handlers are claimed apart, into the room
``async_concurrency`` leaves, and run as tasks on the executors' one event
loop (``jobdeck.worker.async_loop``), holding no thread while they await.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from jobdeck.core import forks, processes
from jobdeck.core.clock import Clock, since_boot
from jobdeck.core.crashpoints import crash_point
from jobdeck.health import Health
from jobdeck.jobs.handlers import Registry
from jobdeck.store import JobRecord, Store
from jobdeck.store.faults import Outage, is_transient
from jobdeck.worker.acks import Acker
from jobdeck.worker.async_loop import FINALLY_GRACE
from jobdeck.worker.executors import Executors, not_retried_note
from jobdeck.worker.holdings import Holdings, Slot
from jobdeck.worker.lease import Lease
from jobdeck.worker.leasing import Heartbeats
from jobdeck.worker.logs import AttemptLogs
from jobdeck.worker.monitor import Monitor
from jobdeck.worker.results import first_line
from jobdeck.worker.settings import PoolSettings
from jobdeck.worker.writes import RETRY_CAP, STOP_MARGIN, Writes, log

__all__ = ["RETRY_CAP", "STOP_MARGIN", "WorkerPool", "new_worker_id", "not_retried_note"]


def new_worker_id() -> str:
    """``host:pid.nonce:pool``: the process (``jobdeck.core.processes.name``), then this pool."""
    return f"{processes.name()}:{uuid.uuid4().hex[:6]}"


class WorkerPool:
    """A pool built from the narrow things it uses: the store, the clock, the
    handler registry and its ``PoolSettings``; ``health`` (the deck's, when
    given) hears of a wedged pool while it runs. ``jobdeck.runtime.pool_for``
    builds one from a deck's config."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        registry: Registry,
        settings: PoolSettings,
        *,
        worker_id: str | None = None,
        queues: list[str] | None = None,
        health: Health | None = None,
        on_unhealthy: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.registry = registry
        self.settings = settings
        self.health = health
        self.threads = settings.threads
        self.worker_id = worker_id = worker_id or new_worker_id()
        self.queues = queues
        self.poll_interval = settings.poll_interval

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._ended = threading.Event()
        """Set once the executors are told to exit: the monitor and the heartbeats end."""
        self._hurry = threading.Event()
        """Set by ``hurry``: ``stop`` ends its grace now."""
        self._threads: list[threading.Thread] = []
        self._started = False

        self.lease = Lease(settings.stall_timeout)
        self.holdings = holdings = Holdings(
            settings.threads, settings.batch, sqlite=store.sqlite, async_concurrency=settings.async_concurrency
        )
        self.writes = writes = Writes(store.storage, self.lease, self.wake)
        self.logs = logs = AttemptLogs(store, settings.log_limits, clock, holdings)
        self.acker = acker = Acker(
            store, clock, holdings, writes, logs, worker_id=worker_id, queues=queues, types=self._thread_types,
            may_claim=self._may_claim, limits_hold_back=settings.limits_hold_back, wake=self.wake,
            stopping=self._stopping, spool_folder=settings.spool_folder,
        )  # fmt: skip
        self.executors = executors = Executors(
            store, clock, registry, settings, holdings, logs, self.lease, worker_id=worker_id, done=acker.put
        )
        self.monitor = Monitor(
            store, clock, registry, holdings, acker, writes, logs, worker_id=worker_id,
            max_abandoned_threads=settings.max_abandoned_threads, replace_executor=executors.spawn,
            stopping=self._stopping, on_unhealthy=on_unhealthy, loop_held=executors.loop_held,
            stall_timeout=settings.stall_timeout, executors_now=executors.now_held,
        )  # fmt: skip
        self.heart = Heartbeats(
            store, clock, holdings, self.lease, worker_id=worker_id,
            heartbeat_interval=settings.heartbeat_interval, wake=self.wake,
        )  # fmt: skip
        self.wakeups = store.claimable
        """The wake source: jobs became claimable in this process (subscribed while the pool runs)."""
        self.store.on_cancel(self.cancel_running)

    def _on_loop(self) -> frozenset[str]:
        """The ``async def`` handlers' types that run on the pool's loop (not in a child process)."""
        on_loop = self.registry.async_names()
        return frozenset(t for t in on_loop if not self.executors.in_process(t)) if on_loop else on_loop

    def _thread_types(self) -> list[str]:
        """The types whose jobs run on the threads (all but ``async def`` handlers')."""
        on_loop = self._on_loop()
        names = self.registry.names()
        return [t for t in names if t not in on_loop] if on_loop else names

    def has_room(self) -> bool:
        """The fetcher would claim now: room on the threads, or for ``async def`` jobs on the loop."""
        return not self.holdings.full() or bool(self._on_loop() and self.holdings.async_room())

    def _may_claim(self) -> bool:
        """The pool takes new jobs: its lease is held and it is healthy."""
        return not self.lease.lost and self.monitor.unhealthy_reason() is None

    # -- what the parts answer ------------------------------------------------

    @property
    def write_outage(self) -> Outage | None:
        """Why the pool's last write failed while it is still being retried (no claims meanwhile)."""
        return self.writes.outage

    @property
    def inflight(self) -> int:
        return self.holdings.inflight

    def running_jobs(self) -> list[int]:
        return self.holdings.running_jobs()

    def cancel_running(self, job_ids: list[int], held: bool = False, reason: str = "cancelled") -> list[int]:
        """``Holdings.cancel_running``: this process cancelled running jobs."""
        return self.holdings.cancel_running(job_ids, held, reason)

    def unhealthy_reason(self) -> str | None:
        return self.monitor.unhealthy_reason()

    def health_once(self, now: datetime | None = None) -> str | None:
        return self.monitor.health_once(now)

    def run_job(self, job: JobRecord, thread: threading.Thread | None = None) -> Slot:
        return self.executors.run_job(job, thread)

    def flush_acks_once(self, now: datetime | None = None, refill: bool = False) -> int:
        return self.acker.flush_once(now, refill)

    def heartbeat_once(self, now: datetime | None = None) -> int:
        return self.heart.heartbeat_once(now)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError("worker pool already started")
        self._started = True
        forks.pool_started()
        self.store.register_worker(
            self.worker_id, processes.HOST, os.getpid(), self.threads, self.clock(), queues=self.queues
        )
        self.wakeups.subscribe(self.wake)
        self.acker.reserve_spool()
        self.lease.renew(since_boot())  # registering stamped the worker's row
        ended = self._ended
        loops: tuple[tuple[str, Callable[..., None], tuple[threading.Event, ...]], ...] = (
            ("fetcher", self._fetch_loop, ()), ("acker", self.acker.loop, ()),
            ("monitor", self.monitor.loop, (ended,)), ("heartbeat", self.heart.heartbeat_loop, (ended,)),
            ("lease", self.heart.lease_watch_loop, (ended,)),
        )  # fmt: skip
        for name, target, args in loops:
            t = threading.Thread(target=target, args=args, name=f"jobdeck-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        for _ in range(self.threads):
            self.executors.spawn()
        if self.threads:
            self.executors.start_processes()
        if self.health is not None:
            self.health.register(self.unhealthy_reason)
        log.info("worker pool %s started with %d threads", self.worker_id, self.threads,
                 extra={"event": "worker.started", "worker_id": self.worker_id, "threads": self.threads})  # fmt: skip

    def wake(self) -> None:
        """Something was enqueued in this process: claim now, not at the next poll."""
        self._wake.set()
        if self._on_loop():  # the fetcher may wait for room for the threads: async jobs may be due
            self.holdings.room.set()

    def hurry(self) -> None:
        """End a ``stop``'s grace now (a second shutdown signal): what is
        still running is released at once, and writes that meet an outage
        are no longer retried (what did not land is kept, ``keep_unlanded``).
        Only sets an event and a deadline, so any thread may call it."""
        self._hurry.set()
        self.writes.hurry()

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming, let running jobs finish for up to ``grace`` seconds
        (or until ``hurry``), then release what is left back to ``pending``
        with no retry counted: each started one keeps an attempt row saying
        shutdown interrupted it."""
        if not self._started or self._stopped.is_set():
            return
        grace = self.settings.shutdown_grace if grace is None else grace
        # Every wait and retry below ends by then, database or not.
        give_up_at = time.monotonic() + grace + STOP_MARGIN
        self.writes.stop_by(give_up_at)
        self._stopping.set()
        self._wake.set()
        room = self.holdings.room
        room.set()
        for t in self._threads[:1]:  # the fetcher: nothing new is claimed after it exits
            t.join(timeout=self.writes.time_left())
        with self.acker.refill_lock:  # an acker refill in flight has queued its jobs; none starts now
            try:
                self._release_unstarted()
            except Exception as exc:  # the database is down past the deadline: the sweep rescues them
                log.error("releasing unstarted jobs at shutdown failed (%s)", first_line(exc))
        deadline = min(time.monotonic() + grace, give_up_at)
        while time.monotonic() < deadline and not self._hurry.is_set():
            if self.holdings.idle():
                break
            room.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            room.clear()
        leftover = self.holdings.abandon_running()
        self.executors.stop(grace=min(FINALLY_GRACE, self.writes.time_left()))
        self.acker.ended.set()
        self._ended.set()
        for t in self._threads[1:]:
            t.join(timeout=self.writes.time_left())
        try:
            self.acker.flush_once()
            if leftover:
                self.logs.flush_slots(leftover)
                held = [(s.job.id, s.job.attempt) for s in leftover]
                started = {s.job.id: s.started for s in leftover}
                released = self.writes.retrying(
                    lambda: self.store.release(self.worker_id, held, self.clock(), interrupted=started)
                )
                log.warning("released %d running jobs at shutdown: %s", len(released), released)
            if self.holdings.has_set_aside() and not self.lease.lost:  # one try; else the stalled sweep takes them
                self.heart.release_set_aside()
            self.writes.retrying(lambda: self.store.stop_worker(self.worker_id, self.clock()))
        except Exception as exc:
            # The database stayed unreachable past the grace: what could not
            # be written stays running under this worker, and the stalled
            # sweep of any process rescues it once the heartbeats have stopped.
            log.error("worker pool %s stopped without writing its last state (%s)", self.worker_id, first_line(exc))
        self.acker.keep_unlanded()
        self.wakeups.unsubscribe(self.wake)
        if self.health is not None:
            self.health.unregister(self.unhealthy_reason)
        forks.pool_stopped()
        self._stopped.set()
        log.info(
            "worker pool %s stopped", self.worker_id, extra={"event": "worker.stopped", "worker_id": self.worker_id}
        )

    def _release_unstarted(self) -> None:
        """Under the acker's ``refill_lock``: give back the jobs queued or held for the executors."""
        unstarted = self.acker.take_unstarted()
        if unstarted:
            self.holdings.given_back(j.id for j in unstarted)
            held = [(j.id, j.attempt) for j in unstarted]
            self.writes.retrying(lambda: self.store.release(self.worker_id, held, self.clock()))

    # -- fetching -------------------------------------------------------------

    def fetch_once(self, now: datetime | None = None) -> int:
        """Claim as many due jobs as there is room for; returns how many.
        Jobs of ``async def`` handlers are claimed apart, into the room
        ``async_concurrency`` leaves, and start on the event loop at once."""
        if not self._may_claim() or self.writes.outage is not None:
            return 0  # a pool that cannot acknowledge takes no new jobs
        now = now or self.clock()
        got = 0
        types = self._thread_types()
        room = self.holdings.room_for() if types else 0
        if room > 0:
            claimed = self.store.claim(self.worker_id, now, limit=room, types=types, queues=self.queues)
            if claimed:
                crash_point("claim")
                self.holdings.claimed(claimed)
                self.holdings.queue(claimed)
            got += len(claimed)
        on_loop = self._on_loop()
        room = self.holdings.async_room() if on_loop else 0
        if room > 0:
            claimed = self.store.claim(self.worker_id, now, limit=room, types=sorted(on_loop), queues=self.queues)
            if claimed:
                crash_point("claim")
                self.holdings.claimed(claimed, on_loop=True)
                self.executors.start_async(claimed)
            got += len(claimed)
        return got

    def _fetch_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            if not self.has_room():
                self.holdings.room.wait(timeout=self.poll_interval)
                self.holdings.room.clear()
                continue
            self._wake.clear()
            on_loop = bool(self._on_loop())
            if on_loop:
                self.holdings.room.clear()
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
                if on_loop:
                    # Async jobs' ends free room that only this loop claims
                    # (an acker's refill claims for the threads): wait for
                    # room, which an enqueue (``wake``) sets too.
                    self.holdings.room.wait(timeout=self.poll_interval)
                else:
                    self._wake.wait(timeout=self.poll_interval)
