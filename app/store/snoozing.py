"""Snoozing an attempt (``Transition.SNOOZE``): the handler asked to run
again later, so its job goes back to ``pending`` for a while with no retry
counted. Rare next to completions, so each snooze is its own fenced
statement, in the acker's batch transaction; the completions' batched
statement is untouched."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from jobdeck.core.snooze_words import describe
from jobdeck.core.states import AttemptOutcome, State, Transition
from jobdeck.store import snooze_statements
from jobdeck.store.faults import storable_text
from jobdeck.store.finish import Finishing
from jobdeck.store.models import jobs
from jobdeck.store.records import JobRecord, Outcome
from sqlalchemy import select

SOON = 1.0
"""A snooze shorter than this wakes the claimers at once (it is due before their next poll)."""


class Snoozing(Finishing):
    def snooze_many(self, outcomes: Sequence[Outcome], now: datetime) -> list[int]:
        """Put each snoozed job back to ``pending``, due ``o.snooze`` seconds
        from ``now``, retry count unchanged, each only while held by the
        worker and attempt that snoozed it; a job cancelled meanwhile ends
        ``cancelled``. A snooze past ``o.max_snoozes`` in a row fails the
        attempt instead (the fail rule decides retry or dead). Returns the
        ids whose attempt this ended; refused (late) ones are left out."""
        if not outcomes:
            return []
        ended: list[int] = []
        t = self._t(now)
        soon = False
        with self._one_transaction() as conn:
            current = self._current(conn, [o.job_id for o in outcomes], lock=True)
            over: list[Outcome] = []
            for o in outcomes:
                row = current.get(o.job_id)
                if row is None or o.snooze is None:
                    continue
                attempt = row.attempt if o.attempt is None else o.attempt
                if o.max_snoozes is not None:
                    taken = conn.execute(snooze_statements.snoozes_in_a_row(), {"job": o.job_id}).scalar_one()
                    if taken >= o.max_snoozes:
                        over.append(_over_cap(o, attempt, taken))
                        continue
                until = self._t(now + timedelta(seconds=o.snooze))
                done = self._run(conn, snooze_statements.snooze(), (o.job_id, attempt, o.worker_id, t, until)).first()
                if done is None:
                    continue
                ended.append(o.job_id)
                self._settle(conn, [done], now)
                soon = soon or o.snooze < SOON
                started = o.started_at or row.claimed_at
                said = describe(o.snooze, o.snooze_reason)
                outcome, error = AttemptOutcome.SNOOZED.value, said
                if done[1] == State.CANCELLED.value:
                    outcome, error = AttemptOutcome.CANCELLED.value, f"cancelled while running; the handler {said}"
                values = (o.job_id, attempt, o.worker_id, started and self._t(started), t, outcome,
                          storable_text(error), o.snooze, o.executor)  # fmt: skip
                self._run(conn, snooze_statements.snoozed_attempt(), values)
            if over:
                ended.extend(j.id for j in self.fail_many(over, now))
            if soon:
                self._notify_other_processes(conn)
        if soon:
            self._notify_enqueued()
        return ended

    def snooze(
        self,
        job_id: int,
        worker_id: str,
        seconds: float,
        now: datetime,
        *,
        reason: str | None = None,
        max_snoozes: int | None = None,
    ) -> JobRecord:
        """The HTTP worker's snooze: refused unless running and held by it,
        checked and applied in one transaction (see ``complete``)."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.SNOOZE)
            outcome = Outcome(
                job_id, worker_id, attempt=row.attempt, started_at=row.claimed_at,
                snooze=seconds, snooze_reason=reason, max_snoozes=max_snoozes,
            )  # fmt: skip
            if not self.snooze_many([outcome], now):
                raise self._why_refused(conn, job_id, Transition.SNOOZE)
            return JobRecord.from_row(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())


def _over_cap(o: Outcome, attempt: int, taken: int) -> Outcome:
    """The failure a snooze past ``max_snoozes`` becomes."""
    times = "time" if taken == 1 else "times"
    error = f"Snooze: snoozed {taken} {times} in a row; max_snoozes is {o.max_snoozes}"
    return Outcome(o.job_id, o.worker_id, attempt=attempt, started_at=o.started_at, error=error)
