"""Batches as the pool's acker writes them: many completions (with and
without results, fenced per job) and their attempt rows in one statement
each, on PostgreSQL as arrays (``statements.complete_set``, the attempts'
``as_set``); a claimed job decoded by position equals the job read back."""

from __future__ import annotations

import pytest

from app.states import State
from app.store import NewJob, Outcome
from tests.store.driver import Driver

pytestmark = pytest.mark.backends


def test_a_batch_of_completions_applies_each_fenced_one_with_its_result_and_attempt(drv: Driver) -> None:
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(300)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=300)
    assert len(claimed) == 300
    assert claimed[0] == drv.store.get(claimed[0].id)  # the positional decoder agrees with the read
    stale, intruder, rest = claimed[0], claimed[1], claimed[2:]
    outcomes = [Outcome(stale.id, "w1", attempt=stale.attempt + 1, started_at=drv.now)]
    outcomes.append(Outcome(intruder.id, "w2", attempt=intruder.attempt, started_at=drv.now))
    outcomes += [
        Outcome(j.id, "w1", attempt=j.attempt, started_at=drv.now, result={"n": j.payload["i"]} if i % 2 else None)
        for i, j in enumerate(rest)
    ]
    outcomes.append(Outcome(rest[0].id, "w1", attempt=rest[0].attempt, started_at=drv.now))  # the same one twice

    accepted = drv.store.complete_many(outcomes, drv.now)

    assert sorted(accepted) == sorted({j.id for j in rest})
    for i, j in enumerate(rest):
        done = drv.store.get(j.id)
        assert done.status is State.COMPLETED and done.finished_at == drv.now
        assert done.result == ({"n": j.payload["i"]} if i % 2 else None)
        assert [(a.attempt, a.outcome, a.worker_id) for a in drv.store.attempts_of(j.id)] == [(1, "completed", "w1")]
    for refused in (stale, intruder):
        assert drv.store.get(refused.id).status is State.RUNNING
        assert drv.store.attempts_of(refused.id) == []


def test_a_batch_of_failures_writes_each_attempt_with_its_own_error(drv: Driver) -> None:
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}, max_retries=1) for i in range(50)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=50)
    outcomes = [Outcome(j.id, "w1", attempt=j.attempt, error=f"boom {j.id}", traceback="tb") for j in claimed]
    failed = drv.store.fail_many(outcomes, drv.now)
    assert {j.status for j in failed} == {State.FAILED}
    released = drv.store.release("w2", [(j.id, j.attempt) for j in claimed], drv.now)
    assert released == []  # not its holder: nothing moves, nothing is written
    for j in claimed:
        (attempt,) = drv.store.attempts_of(j.id)
        assert (attempt.outcome, attempt.error) == ("failed", f"boom {j.id}")
