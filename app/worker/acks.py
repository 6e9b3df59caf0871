"""The pool's acknowledgements: one acker thread writes the executors'
outcomes in batches (completions in one statement, failures by the fail
rule, snoozes each by its own fenced statement) and falls back to one
outcome at a time when the database refuses a batch, so one bad row cannot
hold the others.

On SQLite the acker also refills the room the completions free in the same
transaction: one writer, so one commit (one fsync) instead of two. On
PostgreSQL it does not: the fetcher claims on a connection of its own while
the acker completes, so the two statements run at once on two server
processes. Unless a limit holds claims back now (``limits_hold_back``: a
concurrency per key, or a limit whose jobs the last claim took or found
full): the limited claims queue on one advisory lock anyway, and a claim in
the completions' transaction sees the room they free at once, a key's next
job claimed by the commit that ended the last one. What each choice is
worth is measured in the performance docs (the drain, and the flow limits'
scenario)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

from jobdeck.store import JobRecord, Outcome, Store
from jobdeck.store.engine import before_lock_wait
from jobdeck.store.faults import is_transient, storable_text
from jobdeck.worker.holdings import Holdings
from jobdeck.worker.logs import AttemptLogs
from jobdeck.worker.results import first_line
from jobdeck.worker.spool import AckSpool, orphans
from jobdeck.worker.writes import Writes

log = logging.getLogger("jobdeck.worker")

ADOPT_EVERY = 1.0
"""Seconds between looks for outcomes kept by stopped pools, while idle."""

GATHER_MAX = 0.02
"""The longest a limited cycle on PostgreSQL waits for the outcomes of the jobs still running (``Acker._gather``)."""


class Acker:
    """Writes one pool's outcomes (see the module docstring). ``put`` takes
    an outcome from an executor or the monitor; ``may_claim`` says whether
    the pool takes new jobs now (its lease held, its health good)."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        holdings: Holdings,
        writes: Writes,
        logs: AttemptLogs,
        *,
        worker_id: str,
        queues: list[str] | None,
        types: Callable[[], list[str]],
        may_claim: Callable[[], bool],
        limits_hold_back: Callable[[], bool],
        wake: Callable[[], None],
        stopping: threading.Event,
        spool_folder: Path,
    ) -> None:
        self.store = store
        self.clock = clock
        self.holdings = holdings
        self.writes = writes
        self.logs = logs
        self.worker_id = worker_id
        self.queues = queues
        self.types = types
        self.may_claim = may_claim
        self.limits_hold_back = limits_hold_back
        self.wake = wake
        self.stopping = stopping
        self.ended = threading.Event()
        """Set by ``stop`` once the executors are told to exit: the loop writes what is left and ends."""
        self.outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.held: list[JobRecord] = []
        """Jobs the last refill claimed and holds until the next claim (``_hand_over``)."""
        self.refill_lock = threading.Lock()
        """Held from a refill's claim until its jobs are queued; ``stop`` and
        the give-back of an unhealthy pool take it before releasing unstarted jobs."""
        self.spool_folder = spool_folder
        self._spool: AckSpool | None = None
        self._lock = threading.Lock()
        self._unlanded: dict[int, Outcome] = {}
        """Outcomes taken for writing that have not landed (``flush_once``)."""
        self._gathered: list[Outcome] = []
        """Outcomes taken by ``_gather`` for the next ``flush_once`` (in ``_unlanded`` already)."""
        self._cycle = 0.0
        """Seconds the last limited cycle took: ``_gather``'s bound."""
        self._held_back = True
        """The last refill claimed under half its room: a limit, not the pool, bounds what it holds (``_gather``)."""

    def put(self, outcome: Outcome) -> None:
        self.outcomes.put(outcome)

    def take_unstarted(self) -> list[JobRecord]:
        """Under ``refill_lock``: the jobs held for the next claim and those queued for the executors."""
        held, self.held = self.held, []
        return held + self.holdings.take_queued()

    def reserve_spool(self) -> None:
        """Reserve the file for outcomes that never land (``jobdeck.worker.spool``)
        and write what stopped pools on this host kept, once: the loop
        retries if the database refuses now."""
        spool = AckSpool(self.spool_folder, self.worker_id)
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

    def flush_once(self, now: datetime | None = None, refill: bool = False) -> int:
        """Write every queued outcome: completions in one statement, failures
        by the fail rule, all in as few transactions as possible.

        With ``refill`` (the ack loop) the completions' transaction also
        claims jobs for the room they free (``Store.complete_and_claim``):
        one commit instead of an ack's and a claim's, and the fetcher, which
        then finds the pool full, only claims at start-up and when idle."""
        batch, self._gathered = self._gathered, []
        while True:
            try:
                batch.append(self.outcomes.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return 0
        with self._lock:
            self._unlanded.update((id(o), o) for o in batch)  # until they land: ``stop`` keeps them if they never do
        now = now or self.clock()
        logged = [o.log for o in batch if o.log is not None]
        if logged:  # the attempts' last lines, before their outcomes
            self.logs.flush_outcome_logs(logged)
        done = [o for o in batch if o.ok]
        if len(done) < len(batch):
            self._write_ended(batch, now, done=False)
        refilled = (
            self._complete_and_refill(done, self.holdings.thread_held(o.job_id for o in batch), now)
            if done and refill
            else None
        )
        if refilled is None and self.held:  # no refill took them (none ran, or it had no room)
            with self.refill_lock:
                self._hand_over()
        if done and refilled is None:
            self._acknowledge(done, lambda group: self.store.complete_many(group, now), now)
        self.holdings.ended([o.job_id for o in batch], counted=refilled is None)
        if not refilled:  # no refill, or one that found less than the room: the fetcher looks
            self.holdings.room.set()
        with self._lock:
            for o in batch:
                self._unlanded.pop(id(o), None)
        if refilled is None and self.limits_hold_back():
            # The fetcher may be waiting out its poll because a limit held its
            # last claim back; these jobs' ends may have freed that limit.
            # Nothing else wakes it on PostgreSQL (a NOTIFY comes with an
            # enqueue only), and a limited type drained one job per poll.
            self.wake()
        return len(batch)

    def _write_ended(self, outcomes: list[Outcome], now: datetime, done: bool = True, retry: bool = True) -> None:
        """Write the failures and snoozes among ``outcomes`` (and, with
        ``done``, the completions), each kind by its rule; without ``retry``
        one try, raising an outage."""
        acknowledge = self._acknowledge if retry else lambda group, write, _now: write(group)
        failed = [o for o in outcomes if o.error is not None]
        if failed:
            acknowledge(failed, lambda group: self.store.fail_many(group, now), now)
        snoozed = [o for o in outcomes if o.snooze is not None and o.error is None]
        if snoozed:
            acknowledge(snoozed, lambda group: self.store.snooze_many(group, now), now)
        completed = [o for o in outcomes if o.ok] if done else []
        if completed:
            acknowledge(completed, lambda group: self.store.complete_many(group, now), now)

    def adopt_kept_once(self, now: datetime | None = None, retry: bool = True) -> int:
        """Write the outcomes that stopped pools on this host kept because
        they could not write them (``jobdeck.worker.spool``), as their workers'
        (fenced: one rescued meanwhile is refused). Returns how many."""
        adopted = 0
        for orphan in orphans(self.spool_folder, own=self._spool.path if self._spool is not None else None):
            landed = False
            try:
                self._write_ended(orphan.outcomes, now or self.clock(), retry=retry)
                landed = True
            finally:
                orphan.done(landed)
            adopted += len(orphan.outcomes)
            log.warning(
                "wrote %d outcomes that a stopped worker pool kept (%s)", len(orphan.outcomes), orphan.path.name
            )
        return adopted

    def keep_unlanded(self) -> list[Outcome]:
        """At ``stop``, after the last writes: keep the outcomes that never
        landed in this pool's spool, for the next pool on this host; returns
        those that could not be kept, each logged (its job is rescued as
        stalled and runs again)."""
        with self._lock:
            unlanded, self._unlanded = list(self._unlanded.values()), {}
        while True:
            try:
                unlanded.append(self.outcomes.get_nowait())
            except queue.Empty:
                break
        lost = self._spool.keep(unlanded) if self._spool is not None and unlanded else unlanded
        if len(lost) < len(unlanded):
            log.error("kept %d outcomes the database did not take in %s, for the next worker pool on this host: "
                      "jobs %s", len(unlanded) - len(lost), self.spool_folder,
                      [o.job_id for o in unlanded[: len(unlanded) - len(lost)]])  # fmt: skip
        for o in lost:
            log.error("job %s attempt %s: its outcome (%s) was neither stored nor kept; it stays running under %s "
                      "and is rescued as stalled, then runs again", o.job_id, o.attempt,
                      "completed" if o.ok else ("snoozed" if o.error is None else f"failed: {o.error}"),
                      o.worker_id)  # fmt: skip
        if self._spool is not None:
            self._spool.close(kept=len(lost) < len(unlanded))
        return lost

    def _complete_and_refill(self, done: list[Outcome], acked: int, now: datetime) -> bool | None:
        """Complete ``done`` and claim into the room the ``acked`` outcomes
        free, in one transaction; queue the claimed jobs. Returns None when
        it did nothing (stopping, no types, no room), else whether the room
        was filled. The room is reserved in the count in flight while the
        claim runs, so the fetcher cannot claim it too."""
        types = self.types()
        with self.refill_lock:
            if self.stopping.is_set() or not types or not self.may_claim():
                return None
            room = self.holdings.reserve_room(freed=acked)
            if room <= 0:
                return None
            claimed: list[JobRecord] = []
            try:
                with before_lock_wait(self._hand_over):
                    _, claimed = self.writes.retrying(
                        lambda: self.store.complete_and_claim(
                            done, self.worker_id, now, limit=room, types=types, queues=self.queues,
                            before_claim=self._hand_over,
                        )
                    )  # fmt: skip
            except Exception as exc:
                if is_transient(exc):  # still down at the end of shutdown's grace
                    raise
                # One outcome the database refuses must not hold the others:
                # complete them one by one, without the refill.
                log.warning("acknowledging %d completions failed (%s); one by one", len(done), first_line(exc))
                self._one_by_one(done, lambda group: self.store.complete_many(group, now), now)
            finally:
                self._hand_over()  # the last refill's jobs, at the latest now (a failed try, no claim)
                self.holdings.claimed(claimed, reserved=room + acked)
            if self.outcomes.empty() or self.stopping.is_set():
                self.holdings.queue(claimed)
            else:  # the next batch is waiting: its claim statement hands these over
                self.held = claimed
        self._held_back = len(claimed) < room / 2
        return len(claimed) >= room

    def _hand_over(self) -> None:
        """Queue the jobs the last refill held back (under ``refill_lock``).

        On SQLite the executors share the GIL with the acker: queued right
        after the commit, 250 no-op jobs kept the GIL from the acker's next
        transaction until they were done (its BEGIN waited 1.3 ms a batch,
        the executors' own Python time), and none of their work overlapped
        the acker's statements, which run off the GIL. When outcomes are
        already waiting the acker holds the jobs until the next transaction's
        claim statement (``complete_and_claim``'s ``before_claim``), so they
        run while SQLite claims. Held only between one refill and the next,
        which follows at once, and not while it waits for the write lock
        (another process writing: ``before_lock_wait``); ``stop`` and an
        unhealthy pool's release take them with the queued ones."""
        held, self.held = self.held, []
        self.holdings.queue(held)

    def loop(self) -> None:
        next_adoption = 0.0
        while not self.ended.is_set():
            try:
                first = self.outcomes.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() >= next_adoption:
                    next_adoption = time.monotonic() + ADOPT_EVERY
                    try:
                        self.adopt_kept_once()
                    except Exception as exc:
                        log.warning("writing kept outcomes failed (%s)", first_line(exc))
                continue
            self.outcomes.put(first)
            limited = self.limits_hold_back()
            try:
                if limited and not self.store.sqlite and self._held_back:
                    self._gather(min(self._cycle, GATHER_MAX))
                started = time.monotonic()
                self.flush_once(refill=self.store.sqlite or limited)
                self._cycle = time.monotonic() - started
            except Exception as exc:
                # Outages are retried inside until a stop gives up on them;
                # anything else is a bug. Either way the batch's outcomes stay
                # in ``_unlanded``, kept at stop for the next pool.
                if is_transient(exc):
                    log.error("acknowledging a batch of outcomes: the database stayed down past the stop's deadline")
                else:
                    log.exception("acknowledging a batch of outcomes failed")
                self.ended.wait(1.0)

    def _gather(self, bound: float) -> None:
        """Before a limited cycle on PostgreSQL: hand over the jobs the last
        one held, then wait, at most ``bound`` seconds, until every job the
        pool holds has its outcome here.

        A key's next job is claimed by the cycle that completes its last
        one, and a cycle costs its round trips and its COMMIT however few
        jobs it moves. Begun at the first outcome, a cycle took the outcomes
        that had come and the next took the rest while their keys' next jobs
        ran: the keys split into groups that kept out of step, each costing
        a cycle (and, its head of the line jammed by the others' running
        keys, a key walk). Waiting for the stragglers keeps one cycle a
        round of the keys. ``bound`` is what the last cycle took: a
        straggler left out would have waited that long for the next one.
        Only after a refill that a limit held to under half its room: a
        pool kept full (a limit on another type, say) holds more jobs than
        end within the bound, and waited it out every cycle."""
        if self.held:
            with self.refill_lock:
                self._hand_over()
        deadline = time.monotonic() + bound
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if self.holdings.inflight <= len(self._gathered) or left <= 0:
                    return
                try:
                    outcome = self.outcomes.get(timeout=left)
                except queue.Empty:
                    return
            with self._lock:
                self._unlanded[id(outcome)] = outcome
            self._gathered.append(outcome)

    def _acknowledge(self, outcomes: list[Outcome], write: Callable[[list[Outcome]], object], now: datetime) -> None:
        """Write ``outcomes`` in one batch; if the database refuses the batch
        (not an outage: a value it cannot store, a bug), write them one by
        one, so one bad row cannot hold the others."""
        try:
            self.writes.retrying(lambda: write(outcomes))
        except Exception as exc:
            if is_transient(exc):  # still down at the end of shutdown's grace
                raise
            log.warning("acknowledging %d outcomes failed (%s); one by one", len(outcomes), first_line(exc))
            self._one_by_one(outcomes, write, now)

    def _one_by_one(self, outcomes: list[Outcome], write: Callable[[list[Outcome]], object], now: datetime) -> None:
        for o in outcomes:
            try:
                self.writes.retrying(partial(write, [o]))
            except Exception as exc:
                if is_transient(exc):
                    raise
                self._record_unstorable(o, exc, now)

    def _record_unstorable(self, o: Outcome, exc: Exception, now: datetime) -> None:
        """The database refused this outcome as it is: record the attempt as
        failed, saying why, with only values every backend stores (the fail
        rule then retries the job or dead-letters it, as for any failure)."""
        why = storable_text(f"the outcome of this attempt could not be stored: {first_line(exc)}") or ""
        if o.error is not None:
            why = f"{storable_text(o.error)} ({why})"
        failure = Outcome(
            o.job_id, o.worker_id, attempt=o.attempt, started_at=o.started_at, error=why[:2000],
            traceback=storable_text(o.traceback), retryable=o.retryable,
            kind=o.kind if o.error is not None else "failed",
        )  # fmt: skip
        try:
            self.writes.retrying(lambda: self.store.fail_many([failure], now))
        except Exception as again:
            if is_transient(again):
                raise
            log.exception(
                "job %s attempt %s: its outcome could not be stored (%s), nor its failure; "
                "it stays running under %s until this process stops",
                o.job_id, o.attempt, why, self.worker_id,
            )  # fmt: skip
