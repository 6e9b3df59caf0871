"""The pool's event loop: the jobs of ``async def`` handlers run here, each
as a task, all on one thread that the pool starts when the first of them
runs (a pool without async handlers starts none).

An async job holds no executor thread while it awaits: the fetcher claims
such jobs apart, into the room ``async_concurrency`` leaves, and starts them
here at once. Everything else is the pool's as for a thread's job: the slot
in ``Holdings`` (heartbeats, timeouts, stop's grace and release), the
outcome through ``Executors.settle`` (fenced acks, late results refused,
set aside for a lost lease).

- A cancel, a timeout, a lost lease or the end of a stop's grace cancels
  the task (``Task.cancel``), so the handler's ``await`` raises
  ``CancelledError``: from a cancel the job ends ``cancelled``; a timeout
  was failed already by the monitor ("timed out after N s"). The handler's
  ``finally`` blocks get ``FINALLY_GRACE`` seconds; one that is still
  running then is abandoned, its late result refused.
- A watchdog thread notices a loop held longer than ``HELD_WARN`` (a
  blocking call inside an async handler stops every other async job of the
  pool) and logs it with the job that holds it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from jobdeck.core.errors import Cancelled
from jobdeck.jobs.async_context import AsyncJobContext
from jobdeck.jobs.snooze import Snooze
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.timekeeping import record_loop_held
from jobdeck.worker.holdings import Holdings, Slot
from jobdeck.worker.lease import LEASE_LOST
from jobdeck.worker.results import first_line, storable_result

if TYPE_CHECKING:
    from jobdeck.tracing import AttemptSpan
    from jobdeck.worker.executors import Executors

log = logging.getLogger("jobdeck.worker")

FINALLY_GRACE = 5.0
"""Seconds a cancelled task gets to end (its ``finally`` blocks) before it is abandoned."""
HELD_WARN = 1.0
"""Seconds the loop may be held by one step of one task before the watchdog says so."""
TICK = 0.05
"""Seconds between the loop's looks at its tasks (cancels to pass on); its heartbeat for the watchdog."""


@dataclass
class _Running:
    slot: Slot
    cancelled_at: float | None = None
    given_up: bool = False


@dataclass(frozen=True)
class Held:
    """One time the loop was held past ``HELD_WARN``: by which job, how long."""

    job_id: int | None
    job_type: str | None
    seconds: float

    @property
    def by(self) -> str:
        return f"job {self.job_id} ({self.job_type})" if self.job_id is not None else "no job's task (a callback)"


class AsyncLoop:
    """One pool's event loop thread and its watchdog (see the module docstring)."""

    def __init__(self, executors: Executors, holdings: Holdings) -> None:
        self.executors = executors
        self.holdings = holdings
        self.loop = asyncio.new_event_loop()
        self._tasks: dict[asyncio.Task[None], _Running] = {}
        """The running jobs' tasks; changed on the loop's thread only."""
        self._beat = time.monotonic()
        self._ended = threading.Event()
        self.held: list[Held] = []
        """The times the loop was held past ``HELD_WARN`` (the last 100)."""
        self.thread = threading.Thread(target=self._run, name="jobdeck-async-loop", daemon=True)
        self.watchdog = threading.Thread(target=self._watch, name="jobdeck-async-watchdog", daemon=True)
        self.thread.start()
        self.watchdog.start()

    # -- the pool's side ----------------------------------------------------------

    def start_jobs(self, jobs: list[JobRecord]) -> None:
        """Begin each job's slot now (on the caller's thread, so a stop that
        follows finds it running) and start its task on the loop."""
        slots = [self.executors.open_slot(job, self.thread, on_loop=True) for job in jobs]
        begun = [slot for slot in slots if slot is not None]  # the others were set aside: the lease is lost
        if begun:  # one wake-up of the loop for the whole claim
            self.loop.call_soon_threadsafe(self._spawn, begun)

    def wait(self, awaitable: Awaitable[Any]) -> Any:
        """Run an awaitable that a plain function returned, on this loop, and
        wait for its result on the calling thread (which it keeps meanwhile)."""

        async def run() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def running(self) -> int:
        return len(self._tasks)

    def lag(self) -> float:
        """Seconds the loop is late for its tick now, to a tenth: 0.0 while it
        keeps up; a step that blocks it makes every async job of the pool wait that long."""
        return round(max(0.0, time.monotonic() - self._beat - TICK), 1)

    def holding(self) -> Held | None:
        """The hold going on now, if the loop has not ticked for ``HELD_WARN`` seconds."""
        seconds = time.monotonic() - self._beat
        if seconds <= HELD_WARN or not self.thread.is_alive():
            return None
        run = self._tasks.get(asyncio.current_task(self.loop))  # type: ignore[arg-type]
        job = run.slot.job if run is not None else None
        return Held(job.id if job else None, job.type if job else None, seconds)

    def stop(self, grace: float) -> None:
        """Cancel the tasks still running (their slots were given up by the
        stop), give them up to ``grace`` seconds, then end the loop."""
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._cancel_all(grace), self.loop).result(timeout=grace + 1.0)
            except Exception as exc:
                log.warning("async handlers did not end at stop (%s)", first_line(exc))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=1.0)
        self._ended.set()

    # -- on the loop ----------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self._ended.set()
            self.loop.close()

    def _spawn(self, slots: list[Slot]) -> None:
        for slot in slots:
            task = self.loop.create_task(self._job(slot), name=f"jobdeck-job-{slot.job.id}")
            self._tasks[task] = _Running(slot)
            task.add_done_callback(self._tasks.pop)

    def _tick(self) -> None:
        """Pass cancels on to the tasks, and give up on those that ignore them."""
        now = self._beat = time.monotonic()
        for task, run in list(self._tasks.items()):
            slot = run.slot
            if run.cancelled_at is None:
                if slot.cancelled.is_set() or slot.abandoned:
                    run.cancelled_at = now
                    task.cancel()
            elif not run.given_up and now - run.cancelled_at > FINALLY_GRACE:
                run.given_up = True
                try:
                    self._give_up(run)
                except Exception:  # a bug: say so, and keep watching the other tasks
                    log.exception("giving up on job %s's async handler failed", slot.job.id)
        self.loop.call_later(TICK, self._tick)

    def _give_up(self, run: _Running) -> None:
        """A task still running ``FINALLY_GRACE`` after its cancel: settle its
        job without it (its late end is refused) and let it run on."""
        job, slot = run.slot.job, run.slot
        log.warning("job %s (%s): its async handler ignored its cancel for %g s; abandoned",
                    job.id, job.type, FINALLY_GRACE, extra={"job_id": job.id, "job_type": job.type})  # fmt: skip
        if slot.abandoned:
            return  # timed out or released: its outcome is written already
        error = first_line(Cancelled(job.id)) if slot.cancelled.reason != LEASE_LOST else LEASE_LOST
        outcome = Outcome(
            job.id, self.executors.worker_id, attempt=job.attempt, started_at=slot.started, executor="async"
        )
        outcome.error = f"{error} (its handler ignored the cancel for {FINALLY_GRACE:g} s)"
        outcome.retryable = False
        self.executors.settle(slot, outcome, None)

    async def _cancel_all(self, grace: float) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)

    async def _job(self, slot: Slot) -> None:
        tracing = self.executors.settings.tracing
        if tracing is None:
            await self._attempt(slot, None)
            return
        with tracing.attempt(slot.job) as span:
            await self._attempt(slot, span)

    async def _attempt(self, slot: Slot, span: AttemptSpan | None) -> None:
        executors = self.executors
        job = slot.job
        spec = executors.registry.get(job.type)
        outcome = Outcome(job.id, executors.worker_id, attempt=job.attempt, started_at=slot.started, executor="async")
        ctx: AsyncJobContext | None = None
        try:
            if spec is None:
                raise LookupError(f"no handler registered for {job.type!r} in this process")
            if slot.cancelled.is_set():
                raise Cancelled(job.id)  # cancelled before it started: the handler never runs
            ctx = cast(AsyncJobContext, executors.context(slot, AsyncJobContext))
            if span is not None:
                span.instrument(ctx)
            if slot.log is not None:
                executors.logs.capture_task(job, slot.log)
            result = await spec.fn(job.payload, ctx)
            if isinstance(result, Snooze):
                raise result  # returned or raised, one path
            outcome.result = storable_result(result, executors.settings.max_result_bytes)
        except asyncio.CancelledError as exc:
            why: BaseException = exc
            if slot.cancelled.is_set() and slot.cancelled.reason != LEASE_LOST:
                why = Cancelled(job.id)  # a person or the API: the job ends cancelled
            executors.failed(job, outcome, why, span)
        except BaseException as exc:  # as on a thread: SystemExit too is the handler's failure
            executors.failed(job, outcome, exc, span)
        if ctx is not None and not slot.cancelled.is_set():
            await ctx.progress_written()  # its last progress lands before its outcome, as a thread's does
        executors.settle(slot, outcome, span)

    # -- the watchdog -----------------------------------------------------------------

    def _watch(self) -> None:
        """Say when the loop is held: no tick for ``HELD_WARN`` seconds means
        one task's step (or a callback) blocks it, and every other async job
        of the pool waits. Logged, and kept in the pool's row for the Workers
        page when it is noticed and again, with its whole length, when it ends."""
        held: Held | None = None
        since = 0.0
        while not self._ended.wait(TICK * 2):
            beat = self._beat
            seconds = time.monotonic() - beat
            if seconds <= HELD_WARN:
                if held is not None:
                    held = Held(held.job_id, held.job_type, beat - since)
                    self.held[-1] = held
                    self._record(held)
                    log.warning("the async handlers' loop runs again, after %.1f s held by %s",
                                held.seconds, held.by)  # fmt: skip
                    held = None
                continue
            if held is not None:
                continue
            since = beat
            held = self.holding() or Held(None, None, seconds)
            self.held = [*self.held[-99:], held]
            log.warning(
                "the async handlers' loop is held for %.1f s by %s: a blocking call in an async handler "
                "stops every async job of this pool; await it, or run it with asyncio.to_thread",
                seconds, held.by,
                extra={"event": "worker.loop_held", "job_id": held.job_id, "job_type": held.job_type},
            )  # fmt: skip
            self._record(held)

    def _record(self, held: Held) -> None:
        executors = self.executors
        try:
            record_loop_held(
                executors.store, executors.worker_id, held.seconds, held.job_id, held.job_type, executors.clock()
            )
        except Exception as exc:  # shown on the Workers page only; logged above
            log.warning("recording the held loop in the workers row failed (%s)", first_line(exc))
