"""The pool's executors: threads that each take a claimed job off the work
queue, run its handler and hand its outcome to the acker. A handler's
failure of any kind (``SystemExit`` included) is the job's, never the
thread's: the pool stops its executors with a sentinel, never by raising
into them."""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core import forks
from jobdeck.core.errors import Cancelled, DeadLetter
from jobdeck.jobs.context import JobContext
from jobdeck.jobs.handlers import HandlerSpec, Registry
from jobdeck.jobs.snooze import InvalidSnooze, Snooze, seconds_of
from jobdeck.store import JobRecord, Outcome, Store
from jobdeck.worker.async_loop import AsyncLoop, Held
from jobdeck.worker.holdings import Holdings, Slot
from jobdeck.worker.lease import LEASE_LOST, Lease
from jobdeck.worker.logs import AttemptLogs
from jobdeck.worker.process_run import ChildFailure, run_in_child
from jobdeck.worker.processes import ProcessPool
from jobdeck.worker.results import first_line, format_traceback, storable_result
from jobdeck.worker.settings import PoolSettings

if TYPE_CHECKING:
    from jobdeck.tracing import AttemptSpan

log = logging.getLogger("jobdeck.worker")


def not_retried_note(exc: BaseException, job: JobRecord) -> str:
    """The last line of the error of an attempt sent to dead by an error no
    retry can fix while retries were left, so the job's page says why they
    went unused. Nothing when none were left (dead either way) or for a
    ``DeadLetter``, whose handler chose dead and says so in its own words.
    The fingerprint reads the first line only: the groups stay as they were."""
    if isinstance(exc, DeadLetter) or job.retry_count >= job.max_retries:
        return ""
    return f"\n(not retried: {type(exc).__name__} is non-retryable)"


class Executors:
    """Runs one pool's handlers; ``done`` takes each outcome (the acker's ``put``)."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        registry: Registry,
        settings: PoolSettings,
        holdings: Holdings,
        logs: AttemptLogs,
        lease: Lease,
        *,
        worker_id: str,
        done: Callable[[Outcome], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.registry = registry
        self.settings = settings
        self.holdings = holdings
        self.logs = logs
        self.lease = lease
        self.worker_id = worker_id
        self.done = done
        self.threads: list[threading.Thread] = []
        """Every executor started (those abandoned after a timeout too)."""
        self.loop: AsyncLoop | None = None
        """The event loop of ``async def`` handlers, started by the first of their jobs."""
        self._loop_lock = threading.Lock()
        self._in_process: dict[str, bool] = {}
        self.children: ProcessPool | None = None
        """The child processes of ``executor = "process"`` types, started by ``start_processes``."""

    def spawn(self) -> None:
        """Start one more executor thread."""
        t = threading.Thread(target=self._loop, name="jobdeck-executor", daemon=True)
        self.threads.append(t)
        t.start()

    def stop(self, grace: float = 0.0) -> None:
        """Tell every executor to exit once the jobs queued before are taken,
        and end the event loop, if one started: its tasks still running are
        cancelled and get up to ``grace`` seconds to run their ``finally``
        blocks. Child processes end too (a running one was given up already)."""
        for _ in self.threads:
            self.holdings.work.put(None)  # type: ignore[arg-type]  # wakes executors so they exit
        if self.loop is not None:
            self.loop.stop(grace)
        if self.children is not None:
            self.children.stop()

    def now_held(self) -> dict[str, Any]:
        """Per executor, its capacity and busy slots; for the async loop its
        lag; for the process pool its children and restarts by cause (the
        pool's row keeps it for the Workers page and ``GET /api/workers``).
        A process job holds a thread too: the one that drives its child."""
        slots = self.holdings.running_slots()
        held: dict[str, Any] = {
            "thread": {"capacity": self.settings.threads, "busy": sum(1 for s in slots if not s.on_loop)}
        }
        loop = self.loop
        if loop is not None:
            held["async"] = {"capacity": self.settings.async_concurrency, "busy": loop.running(), "lag": loop.lag()}
        children = self.children
        if children is not None:
            held["process"] = children.summary()
        return held

    def in_process(self, job_type: str) -> bool:
        """Jobs of ``job_type`` run in a child process (``executor = "process"``)."""
        known = self._in_process.get(job_type)
        if known is None:
            spec = self.registry.get(job_type)
            if spec is None:
                return False
            known = self._in_process[job_type] = (
                self.settings.executor(job_type, spec.executor, spec.queue) == "process"
            )
        return known

    def start_processes(self) -> ProcessPool | None:
        """The pool of child processes, started if any registered type runs in one."""
        with self._loop_lock:
            if self.children is None and any(self.in_process(name) for name in self.registry.names()):
                settings = self.settings
                self.children = ProcessPool(
                    settings.process_workers or os.cpu_count() or 1,
                    max_jobs_per_child=settings.max_jobs_per_child, handler_modules=list(settings.handler_modules),
                )  # fmt: skip
            children = self.children
        if children is not None:
            children.start()
        return children

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            job = self.holdings.work.get()
            if job is None:
                return
            slot = self.run_job(job, me)
            if slot.abandoned:
                return  # a replacement thread took this one's place

    def run_job(self, job: JobRecord, thread: threading.Thread | None = None) -> Slot:
        """Run one claimed job's handler and queue its outcome for the acker,
        in the attempt's span when tracing is on (``jobdeck.tracing``)."""
        tracing = self.settings.tracing
        if tracing is None:
            return self._run(job, thread, None)
        with tracing.attempt(job) as span:
            return self._run(job, thread, span)

    def start_async(self, jobs: list[JobRecord]) -> None:
        """Start claimed jobs of ``async def`` handlers as tasks on the pool's
        event loop (started by the first of them): each holds a running slot
        from now, so a stop waits for it and releases it like a thread's."""
        self.async_loop().start_jobs(jobs)

    def async_loop(self) -> AsyncLoop:
        with self._loop_lock:
            if self.loop is None:
                self.loop = AsyncLoop(self, self.holdings)
            return self.loop

    def loop_held(self) -> Held | None:
        """The hold of the event loop of async handlers going on now, if any."""
        return self.loop.holding() if self.loop is not None else None

    def open_slot(self, job: JobRecord, thread: threading.Thread, on_loop: bool = False) -> Slot | None:
        """The running slot of ``job``'s attempt, begun (None: the lease is
        lost and the job was set aside instead of run)."""
        spec = self.registry.get(job.type)
        mono = time.monotonic()
        # A process job's own driver kills its child at the timeout; no thread is abandoned.
        timeout = spec.timeout if spec and not self.in_process(job.type) else None
        slot = Slot(job, self.clock(), mono, mono + timeout if timeout else None, thread, on_loop=on_loop)
        slot.log = self.logs.new_log(job)
        return slot if self.holdings.begin(slot, self.lease) else None

    def context(self, slot: Slot, factory: type[JobContext] = JobContext) -> JobContext:
        job = slot.job
        return factory(
            self.store, job.id, job.attempt, self.worker_id, job.type, self.clock,
            cancelled=slot.cancelled, log=slot.log, retries=job.retry_count,
        )  # fmt: skip

    def _run(self, job: JobRecord, thread: threading.Thread | None, span: AttemptSpan | None) -> Slot:
        spec = self.registry.get(job.type)
        slot = self.open_slot(job, thread or threading.current_thread())
        if slot is None:
            return Slot(job, self.clock(), time.monotonic(), None, thread or threading.current_thread())
        buffer = slot.log
        assert buffer is not None
        outcome = Outcome(job.id, self.worker_id, attempt=job.attempt, started_at=slot.started)
        outcome.executor = "process" if self.in_process(job.type) else "thread"
        try:
            if spec is None:
                raise LookupError(f"no handler registered for {job.type!r} in this process")
            if slot.cancelled.is_set():
                raise Cancelled(job.id)  # cancelled while it waited here: the handler never starts
            ctx = self.context(slot)
            if span is not None:
                span.instrument(ctx)
            with self.logs.capturing(job, buffer):
                result = self._in_child(slot, ctx, spec) if self.in_process(job.type) else spec.fn(job.payload, ctx)
                if result is not None and inspect.isawaitable(result):  # a plain function that returned an awaitable
                    result = self.async_loop().wait(result)
            if forks.forked:  # a child the handler forked returned here: it is no executor
                forks.leave(0, f"the end of job {job.id}'s handler")
            if isinstance(result, Snooze):
                raise result  # returned or raised, one path
            outcome.result = storable_result(result, self.settings.max_result_bytes)
        except BaseException as exc:
            # SystemExit and KeyboardInterrupt from a handler (sys.exit() in
            # library code, a stray raise) are the handler's failure like any
            # other: letting them through killed this thread and left the job
            # running forever. The pool stops its executors with a sentinel,
            # never by raising into them, so nothing here is the pool's own.
            if forks.forked:
                forks.leave(forks.exit_status(exc), f"the end of job {job.id}'s handler")
            self.failed(job, outcome, exc, span)
        return self.settle(slot, outcome, span)

    def _in_child(self, slot: Slot, ctx: JobContext, spec: HandlerSpec) -> object:
        children = self.children or self.start_processes()
        assert children is not None
        limit = self.settings.memory_limit(slot.job.type, spec.queue)
        return run_in_child(children, slot, ctx, spec, memory_limit=limit, cancel_grace=self.settings.cancel_grace)

    def failed(self, job: JobRecord, outcome: Outcome, exc: BaseException, span: AttemptSpan | None) -> None:
        """Make ``outcome`` the attempt's failure by ``exc``, or the snooze it
        asked for; called in the ``except`` block (the traceback is read there)."""
        spec = self.registry.get(job.type)
        if isinstance(exc, ChildFailure):  # a process job's: its child's words and classes
            if span is not None:
                span.failed(exc)
            exc.fill(outcome, spec, self.settings.non_retryable(job.type))
            if spec is not None and not outcome.retryable and job.retry_count < job.max_retries:
                why = f"{exc.line.split(':')[0]} is non-retryable" if exc.names else "it would fail the same way"
                outcome.error = f"{outcome.error}\n(not retried: {why})"
            return
        failure: BaseException | None = exc
        if isinstance(exc, Snooze) and spec is not None:
            failure = self._snoozed(outcome, exc, job.type)
        if failure is not None:
            if span is not None:
                span.failed(failure)
            outcome.error = first_line(failure)
            outcome.traceback = format_traceback()
            outcome.retryable = spec is not None and spec.retries(failure, self.settings.non_retryable(job.type))
            if spec is not None and not outcome.retryable:
                outcome.error += not_retried_note(failure, job)

    def settle(self, slot: Slot, outcome: Outcome, span: AttemptSpan | None) -> Slot:
        """The handler of ``slot`` ended with ``outcome``: hand it to the acker,
        unless it is late (timed out or released meanwhile: refused) or it
        stopped for a lost lease (set aside, given back once the lease is held again)."""
        job, buffer = slot.job, slot.log
        elapsed = time.monotonic() - slot.started_mono
        stopped_for_lease = outcome.error is not None and slot.cancelled.reason == LEASE_LOST
        # the average sizes the threads' prefetch: an async job's wait is no thread's time
        late = self.holdings.finish(slot, set_aside=stopped_for_lease, took=None if slot.on_loop else elapsed)
        if span is not None:
            span.settle(job, outcome, late=late, set_aside=stopped_for_lease)
        if stopped_for_lease and not late:  # not a failure: given back once the lease is held again
            self.logs.flush_log(buffer)
            return slot
        if late:
            log.warning("late result of job %s attempt %s refused (timed out or released)", job.id, job.attempt)
            self.logs.flush_log(buffer)  # its lines are still the attempt's
            return slot
        if buffer is not None and buffer.has_pending():  # the acker writes it before the outcome
            outcome.log = buffer
        self.done(outcome)
        return slot

    def _snoozed(self, outcome: Outcome, snooze: Snooze, job_type: str) -> InvalidSnooze | None:
        """Make ``outcome`` the snooze the handler asked for (any ``Snooze``,
        subclasses included); a bad delay is returned as the failure."""
        try:
            outcome.snooze, outcome.snooze_reason = seconds_of(snooze)
        except InvalidSnooze as bad:
            return bad
        outcome.max_snoozes = self.settings.max_snoozes(job_type)
        return None
