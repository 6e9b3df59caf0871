"""The pool's side of per-job logs (``jobdeck.jobs.joblogs``): each attempt gets a
buffer, the monitor writes the buffers that have lines every
``[logs] flush_interval`` seconds, and what is left when the handler
returns rides with the outcome: the acker writes the lines of its whole
batch in one transaction, before the outcomes (so the job's log is complete
by the time it shows as finished).

A write that fails is logged; if the failure may pass (an outage) its
lines stay buffered for the next flush, otherwise they are dropped. At the
attempt's end there is no next flush, so a database outage then (or the
process dying at any time) loses the unflushed tail, never more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime

from jobdeck.core.loglines import LogLimits
from jobdeck.jobs.joblogs import AttemptLog, Pending, install_capture
from jobdeck.store import JobRecord, Store
from jobdeck.store.joblogs import append_lines, append_many
from jobdeck.worker.holdings import Holdings, Slot
from jobdeck.worker.results import first_line

log = logging.getLogger("jobdeck.worker")

_NOT_CAPTURING = nullcontext()


class AttemptLogs:
    """Buffers and flushes the attempts' logs for one pool (see the module docstring)."""

    def __init__(self, store: Store, limits: LogLimits, clock: Callable[[], datetime], holdings: Holdings) -> None:
        self.store = store
        self.limits = limits
        self.clock = clock
        self.holdings = holdings
        self._next_flush = 0.0

    def new_log(self, job: JobRecord) -> AttemptLog:
        """The buffer of ``job``'s attempt: no database work until it has lines."""
        return AttemptLog(job.id, job.attempt, self.limits, self.clock, self._write_log)

    def _write_log(self, buffer: AttemptLog, pending: Pending) -> None:
        append_lines(self.store, buffer.job_id, buffer.attempt, pending.lines, pending.dropped, buffer.limits)

    def capturing(self, job: JobRecord, buffer: AttemptLog) -> AbstractContextManager[None]:
        """While the handler runs: its thread's ``logging`` records go into
        ``buffer`` if its type captures (``[logs] capture_logging``). A type
        that does not capture gets a shared no-op context, not a generator
        per job."""
        if not self.limits.captures(job.type):
            return _NOT_CAPTURING
        return self._captured(buffer)

    def capture_task(self, job: JobRecord, buffer: AttemptLog) -> None:
        """In an ``async def`` handler's task: its ``logging`` records go into
        ``buffer`` if its type captures (the task's own context; the loop's
        thread runs many attempts at once)."""
        if self.limits.captures(job.type):
            install_capture().bind_task(buffer)

    @contextmanager
    def _captured(self, buffer: AttemptLog) -> Iterator[None]:
        capture = install_capture()
        capture.bind(buffer)
        try:
            yield
        finally:
            capture.bind(None)

    def flush_log(self, buffer: AttemptLog | None) -> int:
        """Write ``buffer``'s lines now; a failure is logged, not raised."""
        if buffer is None or not buffer.has_pending():
            return 0
        try:
            return buffer.flush()
        except Exception as exc:
            log.warning(
                "job %s attempt %s: writing its log failed (%s)", buffer.job_id, buffer.attempt, first_line(exc)
            )
            return 0

    def flush_outcome_logs(self, buffers: list[AttemptLog]) -> int:
        """The acker's batch: what the ended attempts still had buffered, in
        ONE transaction before their outcomes (a handler that logs costs its
        executor no write of its own, and SQLite's writers one transaction per
        batch, not per attempt). A failure is logged, not raised: the
        outcomes matter more than their logs."""
        taken = [(b, b.take()) for b in buffers]
        items = [(b.job_id, b.attempt, p.lines, p.dropped, b.limits) for b, p in taken if p.lines or p.dropped]
        if not items:
            return 0
        try:
            append_many(self.store, items)
        except Exception as exc:
            log.warning("writing the logs of %d ended attempts failed (%s)", len(items), first_line(exc))
            return 0
        return sum(len(lines) for _, _, lines, _, _ in items)

    def flush_logs_once(self) -> int:
        """Write the buffered lines of every running attempt; returns how many."""
        buffers = self.holdings.logs_pending()
        return sum(self.flush_log(b) for b in buffers)

    def flush_logs_due(self, mono_now: float | None = None) -> int:
        """``flush_logs_once`` when ``flush_interval`` has passed (the monitor's tick)."""
        mono_now = time.monotonic() if mono_now is None else mono_now
        if mono_now < self._next_flush:
            return 0
        self._next_flush = mono_now + self.limits.flush_interval
        return self.flush_logs_once()

    def wait_a_whole_interval(self) -> None:
        """The first batch of lines waits one whole interval too: an attempt
        that starts with the pool is not split by the monitor's first tick."""
        self._next_flush = time.monotonic() + self.limits.flush_interval

    def flush_slots(self, slots: list[Slot]) -> None:
        """Write what released attempts had buffered (shutdown)."""
        for slot in slots:
            self.flush_log(slot.log)
