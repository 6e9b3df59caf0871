"""What a running job's holder does on its way: heartbeats (one job's, a
pool's), progress, and the release of held jobs at shutdown; and the check
that a job is held, which finishing it shares (``jobdeck.store.finish``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jobdeck.core.errors import JobNotFound, NotHeld, StaleAttempt, TransitionRefused
from jobdeck.core.states import AttemptOutcome, State, Transition
from jobdeck.store import attempt_statements
from jobdeck.store.claim import Claiming
from jobdeck.store.faults import storable_text
from jobdeck.store.graph_store import Graph
from jobdeck.store.models import jobs
from jobdeck.store.records import JobRecord, PoolBeat
from sqlalchemy import Connection, select

CANCELLED = State.CANCELLED.value


class Holding(Graph, Claiming):
    def _current(self, conn: Connection, ids: list[int], lock: bool = False) -> dict[int, Any]:
        return {row.id: row for row in conn.execute(attempt_statements.current(lock), {"ids": ids})}

    def _held(self, conn: Connection, job_id: int, worker_id: str, transition: Transition) -> Any:
        row = self._current(conn, [job_id], lock=True).get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        if row.status != State.RUNNING.value:
            raise TransitionRefused(job_id, row.status, transition)
        if row.worker_id != worker_id:
            raise NotHeld(job_id, worker_id, row.worker_id)
        return row

    # -- while running ------------------------------------------------------------

    def heartbeat(self, job_id: int, worker_id: str, now: datetime) -> JobRecord:
        """One job's heartbeat (the HTTP worker's); urgent, like ``heartbeat_worker``.
        A late one is void as in ``heartbeat_pool`` (the job is still checked as held)."""
        params = self._beat_params({"job": job_id, "worker": worker_id, "now": now})
        with self.write(urgent=True) as conn:
            row = conn.execute(attempt_statements.heartbeat("void_at" in params), params).first()
            if row is None:
                self._held(conn, job_id, worker_id, Transition.HEARTBEAT)
                raise self._why_refused(conn, job_id, Transition.HEARTBEAT)
        return JobRecord.from_row(row)

    def heartbeat_worker(self, worker_id: str, now: datetime | Callable[[], datetime]) -> int:
        """``heartbeat_worker_with_cancels``, counting the jobs beaten."""
        return self.heartbeat_worker_with_cancels(worker_id, now)[0]

    def heartbeat_worker_with_cancels(
        self, worker_id: str, now: datetime | Callable[[], datetime]
    ) -> tuple[int, list[int]]:
        """``heartbeat_pool``: how many jobs were beaten, and the ids of those cancelled."""
        beat = self.heartbeat_pool(worker_id, now)
        return len(beat.held), beat.cancelled

    def heartbeat_pool(self, worker_id: str, now: datetime | Callable[[], datetime]) -> PoolBeat:
        """Heartbeat every job a worker holds, and the worker itself; returns
        the jobs beaten (id and attempt: a pool finds there a job it claimed
        without knowing, whose claim's reply was lost) and the ids of those a
        cancel was requested for: how a pool learns of another process's
        cancel within one beat.

        An urgent write (``Store.write``): it must not wait behind the acks
        and claims it vouches for, nor behind other processes' writers.
        Given a clock, the time written is read once the write lock is held,
        so a beat that had to wait still says "alive now", not "alive when
        it started waiting".

        On PostgreSQL, on the database's clock, a beat whose statements reach
        the server more than ``Store.void_after`` seconds after its time
        changes nothing (``claim_statements.on_time``): resent after a
        partition, it would move the heartbeat back past a fresher beat's. On
        SQLite the time is read with the file's write lock held, so a beat
        lands when it says."""
        with self.write(urgent=True) as conn:
            params = self._beat_params({"worker": worker_id, "now": now() if callable(now) else now})
            voidable = "void_at" in params
            beaten = conn.execute(attempt_statements.heartbeat_held(self.dialect, voidable), params).all()
            conn.execute(attempt_statements.heartbeat_worker(voidable), params)
        return PoolBeat(
            {job_id: attempt for job_id, _, attempt in beaten},
            [job_id for job_id, requested_at, _ in beaten if requested_at is not None],
        )

    def _beat_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """A beat's values, with ``void_at`` when late beats are void (``Claiming.void_at``)."""
        for void_at in self.void_at(params["now"]):
            params["void_at"] = void_at
        return params

    def set_progress(
        self, job_id: int, attempt: int, worker_id: str, progress: float | None, message: str | None, now: datetime
    ) -> bool:
        params = {
            "job": job_id,
            "job_attempt": attempt,
            "worker": worker_id,
            "to_progress": progress,
            "message": storable_text(message),
            "now": now,
        }
        with self.write() as conn:
            return bool(conn.execute(attempt_statements.set_progress(), params).rowcount)

    def release(
        self,
        worker_id: str,
        held: Sequence[tuple[int, int]],
        now: datetime,
        *,
        interrupted: Mapping[int, datetime | None] | None = None,
    ) -> list[int]:
        """Give claimed jobs back to ``pending`` without counting a retry
        (graceful shutdown). ``held`` is (job id, attempt) pairs.

        The attempt number is kept, not given back: results are fenced by
        (job, attempt, worker), and a number handed out again would let the
        released attempt's late result complete the next claim of the same
        job by the same worker (a pool claims what it shed).

        ``interrupted`` names the jobs whose handler had started (id ->
        when): shutdown cut them short. Each gets an attempt row saying
        "interrupted by shutdown", so the job's history shows the run that
        did not finish (and an effect it started is seen as that attempt's)."""
        if not held:
            return []
        started = dict(interrupted or {})
        # Every pair as given (a stale attempt of a job listed with its
        # current one must not hide it): the fence matches at most one.
        size, pairs = attempt_statements.fenced_pairs(list(dict.fromkeys(held)))
        t = self._t(now)
        with self.write() as conn:
            moved = self._run(conn, attempt_statements.release(size), (t, worker_id, *pairs)).all()
            self._settle(conn, [r[:4] for r in moved], now)
            released = [r[0] for r in moved]
            rows = [
                (r[0], r[4], worker_id, _maybe(self._t, started[r[0]]), t, *_cut(r[1]), None, None)
                for r in moved
                if r[0] in started
            ]  # fmt: skip
            self._run_many(conn, attempt_statements.attempt(), rows)
            if released:
                self._notify_other_processes(conn)
        if released:
            self._notify_enqueued()
        return released

    def release_held(self, job_id: int, attempt: int, worker_id: str, now: datetime) -> JobRecord:
        """The HTTP worker's release at shutdown: the job back to ``pending``
        at once, no retry counted, its attempt recorded as the pool's release
        records a started one (``interrupted``). Refused unless running, held
        by ``worker_id`` and on ``attempt``: fenced as complete and fail are,
        checked and applied in one transaction."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.RELEASE)
            if row.attempt != attempt:
                raise StaleAttempt(job_id, attempt, row.attempt)
            if not self.release(worker_id, [(job_id, attempt)], now, interrupted={job_id: row.claimed_at}):
                raise self._why_refused(conn, job_id, Transition.RELEASE)
            return JobRecord.from_row(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())


def _cut(status: str) -> tuple[str, str]:
    """The outcome and error of an attempt that shutdown cut short."""
    if status == CANCELLED:
        return CANCELLED, "cancelled; shutdown cut the attempt short"
    return AttemptOutcome.INTERRUPTED.value, "interrupted by shutdown"


def _maybe(fn: Callable[[datetime], Any], value: datetime | None) -> Any:
    return None if value is None else fn(value)
