"""Finishing an attempt: complete (a batch of outcomes, or the HTTP
worker's one), fail and the stall rescue. What a running job reports on its
way, and its release at shutdown, are in ``jobdeck.store.holding``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobdeck.core.crashpoints import crash_point
from jobdeck.core.fingerprint import fingerprint
from jobdeck.core.states import AttemptOutcome, State, Transition
from jobdeck.store import attempt_statements
from jobdeck.store.attempt_statements import CANCELLED_WHILE_RUNNING
from jobdeck.store.claim import UNREAD
from jobdeck.store.enqueue import dumps
from jobdeck.store.faults import storable_text
from jobdeck.store.holding import CANCELLED, Holding
from jobdeck.store.models import jobs
from jobdeck.store.records import JobRecord, Outcome
from jobdeck.store.sqlite import Prepared
from jobdeck.store.transactions import Ahead, Backoff
from sqlalchemy import Connection, select


class Finishing(Holding):
    backoff: Backoff

    def complete_and_claim(
        self,
        outcomes: Sequence[Outcome],
        worker_id: str,
        now: datetime,
        *,
        limit: int,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
        before_claim: Callable[[], object] | None = None,
    ) -> tuple[list[int], list[JobRecord]]:
        """``complete_many`` then ``claim`` in ONE write transaction: the
        pool's acker refills the slots it just freed with one commit (one
        fsync on SQLite FULL) instead of two. Both run unchanged inside it
        (their ``write()`` joins this one), so fencing, attempt rows, SKIP
        LOCKED and an installed ``claim_policy`` (which counts the running
        jobs after these completions) keep their guarantees; if anything
        fails, neither is applied. ``before_claim`` runs just before the
        claim statement (the pool hands its executors work there, to run
        while the database claims). Returns (accepted ids, claimed jobs).

        On PostgreSQL the completions wait for the claim (``Ahead``): the
        flow claim sends them in its first pipelined batch, before its
        advisory lock and its reads, which saves the acker two round trips
        (BEGIN and the completions' own) a cycle; any other claim runs them
        first, as its transaction's first statement."""
        accepted: list[int] = []
        with self.write() as conn:
            self._joined.conn = conn
            try:
                if self.sqlite or limit <= 0 or any(o.attempt is None for o in outcomes):
                    accepted = self.complete_many(outcomes, now)
                else:
                    self._joined.ahead = self._completions_ahead(outcomes, now, accepted)
                changes = None
                if self.sqlite and limit > 0:
                    # Read now, not between the handover and the claim: the
                    # executors handed work take the GIL at the first statement
                    # that lets it go, and the claim would wait for it.
                    self._joined.priorities = self.claimable_priorities(conn)
                    changes = _changes(conn)
                if before_claim is not None:
                    before_claim()
                    if changes is not None and _changes(conn) != changes:
                        self._joined.priorities = UNREAD  # it wrote in this transaction: the claim reads them again
                self._joined.last = True  # nothing follows the claim but the commit
                claimed = self.claim(worker_id, now, limit=limit, types=types, queues=queues) if limit > 0 else []
                ahead = self.take_ahead()
                if ahead is not None:  # the claim ran no statement (none does that today): before the commit
                    ahead.land(None)
            finally:
                self._joined.conn = None
                self._joined.last = False
                self._joined.ahead = None
                self._joined.priorities = UNREAD
        return accepted, claimed

    def _completions_ahead(self, outcomes: Sequence[Outcome], now: datetime, accepted: list[int]) -> Ahead:
        """``outcomes``' completions for a pipelined claim to send first: the
        statement that needs no other in its transaction (``alone``: jobs in
        no workflow and no batch); what it did not apply (those jobs, and
        late results it refused) goes through ``complete_many`` once its
        rows are read, still before the claim's statement and COMMIT.
        ``accepted`` collects the ids completed."""

        def rest(rows: list[Any]) -> list[Outcome]:
            won = {(r[0], r[1]) for r in rows}
            return [o for o in outcomes if (o.job_id, o.attempt) not in won]

        def land(rows: list[Any] | None) -> None:
            if rows is None:  # not sent: the ordinary way
                accepted.extend(self.complete_many(outcomes, now))
                return
            crash_point("ack")
            accepted.extend(r[0] for r in rows)
            left = rest(rows)
            if left:
                accepted.extend(self.complete_many(left, now))

        return Ahead(self._completions(outcomes, self._t(now), alone=True), land, lambda rows: not rest(rows))

    def complete_many(self, outcomes: Sequence[Outcome], now: datetime) -> list[int]:
        """Mark running jobs completed, each only if still held by the worker
        and attempt that ran it, with an attempt row for each completion
        applied; returns the ids accepted (late results of a timed-out or
        rescued attempt are refused).

        On PostgreSQL each worker's batch is one statement
        (``attempt_statements.complete_recorded``). Outside a transaction (the pool's
        acker) that statement runs alone in autocommit for the jobs in no
        workflow and no batch; the rest, and the refused, then go through a
        transaction, where the ends of workflow and batch jobs move the jobs
        waiting on them."""
        if not outcomes:
            return []
        accepted: list[int] = []
        t = self._t(now)
        if self.outside() and all(o.attempt is not None for o in outcomes):
            crash_point("ack")  # this acknowledgement's one statement is its transaction
            with self.single() as conn:
                applied = self._complete_groups(conn, outcomes, t, alone=True)
            accepted = [r[0] for r in applied]
            won = {(r[0], r[1]) for r in applied}
            outcomes = [o for o in outcomes if (o.job_id, o.attempt) not in won]
            if not outcomes:
                return accepted
        with self.write() as conn:
            pending = list(outcomes)
            if any(o.attempt is None for o in pending):
                current = self._current(conn, [o.job_id for o in pending if o.attempt is None])
                for o in pending:
                    if o.attempt is None:
                        row = current.get(o.job_id)
                        o.attempt = row.attempt if row is not None else -1
            applied = self._complete_groups(conn, pending, t)
            accepted.extend(r[0] for r in applied)
            self._settle(conn, [(r[0], r[2], r[3], r[4]) for r in applied], now)
            crash_point("ack")
            if self.sqlite:
                self._record_completed(conn, pending, applied, t)
        return accepted

    def _complete_groups(self, conn: Connection, outcomes: Sequence[Outcome], t: Any, alone: bool = False) -> list[Any]:
        """Complete each worker's ``outcomes`` (those with a result apart);
        returns the rows applied: (id, attempt, status, workflow_id,
        batch_id, worker). On PostgreSQL their attempt rows are written too."""
        applied: list[Any] = []
        if not self.sqlite:
            for prepared, values in self._completions(outcomes, t, alone):
                applied.extend((*r, values[1]) for r in self._run(conn, prepared, values).all())
            return applied
        for (worker_id, has_result, _), group in _by_worker(outcomes).items():
            if has_result:
                rows = []
                for o in group:
                    values = (t, worker_id, o.job_id, o.attempt, dumps(o.result))
                    rows.extend(self._run(conn, attempt_statements.complete(1, True), values).all())
            else:
                size, pairs = attempt_statements.fenced_pairs([(o.job_id, o.attempt) for o in group])
                rows = self._run(conn, attempt_statements.complete(size), (t, worker_id, *pairs)).all()
            applied.extend((*r, worker_id) for r in rows)
        return applied

    def _completions(self, outcomes: Sequence[Outcome], t: Any, alone: bool) -> list[tuple[Prepared, tuple[Any, ...]]]:
        """PostgreSQL: each worker's completions (those with a result apart)
        as one ``complete_recorded`` statement and its values."""
        out: list[tuple[Prepared, tuple[Any, ...]]] = []
        for (worker_id, has_result, executor), group in _by_worker(outcomes).items():
            values: tuple[Any, ...] = (
                t, worker_id, [o.job_id for o in group], [o.attempt for o in group],
                [o.started_at and self._t(o.started_at) for o in group],
            )  # fmt: skip
            if has_result:
                values += ([dumps(o.result) for o in group],)
            out.append((attempt_statements.complete_recorded(has_result, alone), (*values, executor)))
        return out

    def _record_completed(self, conn: Connection, outcomes: Sequence[Outcome], applied: list[Any], t: Any) -> None:
        """SQLite: the attempt rows of the completions ``applied``, one per
        attempt, not for a refused late outcome of the same job in the batch."""
        won = {(r[0], r[1], r[5]): r[2] for r in applied}
        pending = {(o.job_id, o.attempt): o for o in outcomes if (o.job_id, o.attempt, o.worker_id) in won}
        done = AttemptOutcome.COMPLETED.value
        rows, cancelled = [], []
        for o in pending.values():
            started = o.started_at and self._t(o.started_at)
            if won[o.job_id, o.attempt, o.worker_id] == CANCELLED:
                cancelled.append(
                    (o.job_id, o.attempt, o.worker_id, started, t, CANCELLED, CANCELLED_WHILE_RUNNING, None, o.executor)
                )
            else:
                rows.append((o.job_id, o.attempt, o.worker_id, started, t, done, o.executor))
        self._run_many(conn, attempt_statements.attempt(with_error=False), rows)
        self._run_many(conn, attempt_statements.attempt(), cancelled)

    def complete(self, job_id: int, worker_id: str, now: datetime, result: Any = None) -> JobRecord:
        """The HTTP worker's complete: refused unless running and held by it.
        Checked and applied in one transaction (the row locked on PostgreSQL,
        the write lock held on SQLite): checked in one and applied in another,
        a job rescued in between answered 200 unchanged. A completion the
        fenced UPDATE still refuses is a lost race: refused (409)."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.COMPLETE)
            outcome = Outcome(job_id, worker_id, attempt=row.attempt, started_at=row.claimed_at, result=result)
            if not self.complete_many([outcome], now):
                raise self._why_refused(conn, job_id, Transition.COMPLETE)
            return JobRecord.from_row(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())

    def fail_many(self, outcomes: Sequence[Outcome], now: datetime) -> list[JobRecord]:
        """Apply the fail rule to each: ``failed`` with a backoff while
        retry_count < max_retries (and the error is retryable), else ``dead``.
        Returns the jobs as they now stand, in the order given; refused ones
        are left out.

        The batch's attempt rows are written by one statement. On PostgreSQL
        the failures are one UPDATE per kind (retryable or not) over arrays
        (``attempt_statements.fail_set``) where one per job cost a round trip
        each; on SQLite, where a statement is a call into the same process,
        one UPDATE per job."""
        if not outcomes:
            return []
        t = self._t(now)
        with self.write() as conn:
            current = self._current(conn, [o.job_id for o in outcomes], lock=True)
            rows: dict[bool, list[tuple[Any, ...]]] = {True: [], False: []}
            asked: dict[tuple[int, int, str], tuple[Outcome, Any]] = {}
            for o in outcomes:
                row = current.get(o.job_id)
                if row is None:
                    continue
                attempt = row.attempt if o.attempt is None else o.attempt
                if (o.job_id, attempt, o.worker_id) in asked:
                    continue  # the same attempt failed twice in one batch: the first one counts
                asked[o.job_id, attempt, o.worker_id] = (o, row)
                error = storable_text(o.error)
                values: tuple[Any, ...] = (o.job_id, attempt, o.worker_id, t)
                if o.retryable:
                    values += (self._t(now + timedelta(seconds=self.backoff(row.type, row.retry_count))),)
                rows[o.retryable] += [(*values, error, fingerprint(error))]
            failed: dict[tuple[int, int, str], JobRecord] = {}
            for retryable, group in rows.items():
                for moved in self._fail_rows(conn, retryable, group):
                    failed[moved.id, moved.attempt, moved.worker_id or ""] = moved
            done: list[JobRecord] = []
            recorded: list[tuple[Any, ...]] = []
            for (job_id, attempt, worker_id), (o, row) in asked.items():
                job = failed.get((job_id, attempt, worker_id))
                if job is None:
                    continue
                done.append(job)
                started = o.started_at or row.claimed_at
                outcome = CANCELLED if job.status is State.CANCELLED else AttemptOutcome(o.kind).value
                recorded.append(
                    (job_id, attempt, worker_id, started and self._t(started), t, outcome, storable_text(o.error),
                     storable_text(o.traceback), o.executor)
                )  # fmt: skip
            self._run_many(conn, attempt_statements.attempt(), recorded)
            self._settle(
                conn, [(j.id, j.status.value, j.workflow_id, j.batch_id) for j in done if j.status in _ENDS], now
            )
            crash_point("sweep" if outcomes[0].kind == AttemptOutcome.STALLED else "ack")
        self._notify_dead([j for j in done if j.status is State.DEAD])
        return done

    def _fail_rows(self, conn: Connection, retryable: bool, rows: list[tuple[Any, ...]]) -> list[JobRecord]:
        """The failures ``rows`` (values by ``attempt_statements.FAIL_FIELDS``)
        applied; returns the jobs moved."""
        if not rows:
            return []
        if self.sqlite:
            prepared = attempt_statements.fail(retryable)
            return [self._record(r) for values in rows for r in self._run(conn, prepared, values).all()]
        columns = list(zip(*rows, strict=True))
        columns[3] = rows[0][3]  # now: one value, not an array
        return [self._record(r) for r in self._run(conn, attempt_statements.fail_set(retryable), tuple(columns))]

    def fail(
        self,
        job_id: int,
        worker_id: str,
        error: str,
        now: datetime,
        *,
        retryable: bool = True,
        traceback: str | None = None,
    ) -> JobRecord:
        """The HTTP worker's fail: refused unless running and held by it.
        Checked and applied in one transaction (see ``complete``): checked
        apart, the fail landed on the job's next attempt if it was rescued
        and claimed again in between."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.FAIL)
            outcome = Outcome(
                job_id, worker_id, attempt=row.attempt, error=error, traceback=traceback, retryable=retryable
            )
            failed = self.fail_many([outcome], now)
            if not failed:
                raise self._why_refused(conn, job_id, Transition.FAIL)
        return failed[0]

    def rescue_stalled(self, now: datetime, stall_timeout: float, limit: int = 500) -> list[JobRecord]:
        """Running jobs whose heartbeat is older than the stall timeout, held
        by no worker that is still heart-beating: record the attempt as
        stalled and apply the fail rule. Each job's update is conditional on
        its attempt, so concurrent sweepers rescue it once.

        A job's own ``heartbeat_at`` is not enough: a claim stamps it with
        the time the claimer read before it waited for the write lock, and a
        sweeper elsewhere rescued live jobs moments after they were claimed.
        The worker's own row is stamped only by its heartbeat, with the time
        the beat was written. Jobs of a worker with no row (an HTTP worker
        beats each job) go by the job's heartbeat alone.

        Picked and rescued in one transaction (the rows locked on PostgreSQL,
        those another transaction holds skipped): picked apart, a heartbeat
        landing in between was accepted and the job rescued anyway."""
        cutoff = now - timedelta(seconds=stall_timeout)
        with self._one_transaction() as conn:
            rows = conn.execute(attempt_statements.stalled(cutoff, limit)).all()
            return self.fail_many([_stalled(r) for r in rows], now)


_ENDS = frozenset({State.DEAD, State.CANCELLED})
"""The states a failed attempt can end its job in for good (``Graph._settle``)."""


def _stalled(r: Any) -> Outcome:
    return Outcome(
        r.id,
        r.worker_id,
        attempt=r.attempt,
        error=f"stalled: worker {r.worker_id} stopped heart-beating at {r.heartbeat_at.isoformat()}",
        kind=AttemptOutcome.STALLED,
    )


def _by_worker(outcomes: Sequence[Outcome]) -> dict[tuple[str, bool, str | None], list[Outcome]]:
    """``outcomes`` by (worker, with a result, executor): one statement each."""
    groups: dict[tuple[str, bool, str | None], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.worker_id, o.result is not None, o.executor), []).append(o)
    return groups


def _changes(conn: Connection) -> int:
    """SQLite: the rows ``conn``'s connection has written since it opened (``sqlite3``'s ``total_changes``)."""
    raw = conn.connection.dbapi_connection
    assert raw is not None, "a checked-out connection has its driver connection"
    return int(raw.total_changes)
