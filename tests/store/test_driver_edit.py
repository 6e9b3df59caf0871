"""Editing a waiting job (``Store.edit``, ``Jobdeck.edit``) on both
databases: a pending, scheduled or failed job keeps its state, a dead one
is retried, and the edit is fenced on the job as the operator saw it (its
state, attempt and ``updated_at``), so it never lands on a job that moved
on. Validation is the enqueue's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.core.errors import InvalidField, JobMovedOn, JobNotFound, PayloadTooLarge, TransitionRefused
from jobdeck.core.states import State
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.lifecycle import JobChanges, Seen

from tests.store.driver import Driver, race

pytestmark = pytest.mark.backends

HOUR = timedelta(hours=1)


def _seen(job: JobRecord) -> Seen:
    return Seen(job.status, job.attempt, job.updated_at)


def _failed(drv: Driver) -> JobRecord:
    """A job whose first attempt failed, its retry an hour away."""
    job, _ = drv.deck.enqueue("demo.flaky", {"failures": 5}, max_retries=3)
    [claimed] = drv.store.claim("w1", drv.now, limit=1)
    drv.store.fail_many([Outcome(claimed.id, "w1", attempt=claimed.attempt, error="boom")], drv.now)
    return drv.store.get(job.id)


def test_editing_a_scheduled_job_changes_every_field_and_keeps_it_scheduled(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1}, delay_seconds=3600)
    run_at = drv.now + 2 * HOUR
    now = drv.clock.advance(5)
    edited = drv.deck.edit(
        job.id, {"payload": {"n": 2}, "priority": "high", "queue": "mail", "run_at": run_at.isoformat()}, _seen(job)
    )
    after = drv.store.get(job.id)
    assert after == edited.after
    assert (after.status, after.payload, after.priority, after.queue) == (State.PENDING, {"n": 2}, 20, "mail")
    assert after.available_at == run_at and after.is_scheduled(now)
    assert (after.attempt, after.retry_count, after.updated_at) == (0, 0, now)
    assert edited.before.payload == {"n": 1}
    assert edited.summary() == (
        f"payload edited (7 → 7 bytes); priority 0 → 20; queue default → mail; run at "
        f"{(job.available_at).strftime('%Y-%m-%d %H:%M:%S')} UTC → {run_at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
    )


def test_editing_a_due_pending_job_keeps_it_due_and_claimable(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1})
    drv.deck.edit(job.id, {"priority": 5}, _seen(job))
    [claimed] = drv.store.claim("w1", drv.now, limit=1)
    assert (claimed.id, claimed.priority) == (job.id, 5)


def test_editing_a_failed_job_keeps_it_failed_with_its_retry_budget(drv: Driver) -> None:
    job = _failed(drv)
    assert job.status is State.FAILED and job.retry_count == 1
    edited = drv.deck.edit(job.id, {"payload": {"failures": 0}}, _seen(job))
    after = edited.after
    assert (after.status, after.retry_count, after.available_at, after.payload) == (
        State.FAILED, 1, job.available_at, {"failures": 0},
    )  # fmt: skip
    [attempt] = drv.store.attempts_of(job.id)
    assert attempt.payload == {"failures": 5}  # the attempt keeps the payload it ran with


def test_editing_a_dead_job_retries_it_now_or_at_run_at(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.fail", {"x": 1}, max_retries=0)
    [claimed] = drv.store.claim("w1", drv.now, limit=1)
    drv.store.fail_many([Outcome(job.id, "w1", attempt=claimed.attempt, error="boom")], drv.now)
    dead = drv.store.get(job.id)
    assert dead.status is State.DEAD
    now = drv.clock.advance(10)
    edited = drv.deck.edit(job.id, {"payload": {"x": 2}}, _seen(dead))
    assert (edited.after.status, edited.after.available_at, edited.after.finished_at) == (State.PENDING, now, None)
    assert edited.summary().endswith("retried, due " + now.strftime("%Y-%m-%d %H:%M:%S") + " UTC")
    assert drv.store.attempts_of(job.id)[0].payload == {"x": 1}

    [again] = drv.store.claim("w1", now, limit=1)
    drv.store.fail_many([Outcome(job.id, "w1", attempt=again.attempt, error="boom")], now)
    later = now + HOUR
    retried = drv.deck.edit(job.id, {"run_at": later.isoformat()}).after
    assert (retried.status, retried.available_at, retried.retry_count) == (State.PENDING, later, 0)


def test_an_edit_is_refused_when_the_job_was_claimed_meanwhile(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1})
    seen = _seen(job)
    [claimed] = drv.store.claim("w1", drv.clock.advance(1), limit=1)
    with pytest.raises(TransitionRefused, match=f"job {job.id} is running; only pending or failed or dead jobs"):
        drv.deck.edit(job.id, {"payload": {"n": 2}}, seen)
    assert drv.store.get(job.id).payload == {"n": 1}

    # Back to waiting (it failed): the form still shows attempt 0, so it is refused as moved on.
    drv.store.fail_many([Outcome(job.id, "w1", attempt=claimed.attempt, error="boom")], drv.now)
    before = drv.store.get(job.id)
    assert before.status is State.FAILED
    with pytest.raises(JobMovedOn, match=f"job {job.id} changed since it was shown .*now failed, attempt 1"):
        drv.deck.edit(job.id, {"payload": {"n": 2}}, seen)
    assert drv.store.get(job.id) == before


def test_an_edit_is_refused_when_released_or_edited_by_someone_else_meanwhile(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    seen = _seen(job)
    drv.clock.advance(1)
    drv.deck.edit(job.id, {"priority": 3}, seen)  # another operator, the same form
    with pytest.raises(JobMovedOn):
        drv.deck.edit(job.id, {"priority": 9}, seen)
    assert drv.store.get(job.id).priority == 3

    other, _ = drv.deck.enqueue("demo.noop", {"n": 1})
    seen = _seen(other)
    [claimed] = drv.store.claim("w1", drv.clock.advance(1), limit=1)
    drv.store.release("w1", [(other.id, claimed.attempt)], drv.clock.advance(1))  # pending again, attempt 1
    assert drv.store.get(other.id).status is State.PENDING
    with pytest.raises(JobMovedOn):
        drv.deck.edit(other.id, {"priority": 9}, seen)


def test_the_state_and_the_attempt_fence_even_when_the_clock_did_not_move(drv: Driver) -> None:
    """Two writes in the same instant leave ``updated_at`` as the form saw it
    (clocks of several hosts, a coarse clock): the state and the attempt
    number still tell that the job moved on."""
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1})
    seen = _seen(job)
    [claimed] = drv.store.claim("w1", job.updated_at, limit=1)
    drv.store.release("w1", [(job.id, claimed.attempt)], job.updated_at)  # pending again, in the same instant
    assert (drv.store.get(job.id).status, drv.store.get(job.id).updated_at) == (State.PENDING, seen.updated_at)
    before = drv.snapshot(job.id)
    with pytest.raises(JobMovedOn, match="attempt 1"):
        drv.deck.edit(job.id, {"priority": 4}, seen)
    assert drv.snapshot(job.id) == before

    dead = _dead(drv)
    seen = _seen(dead)
    drv.store.retry(dead.id, dead.updated_at)  # someone retried it in the same instant: pending, same attempt
    before = drv.snapshot(dead.id)
    with pytest.raises(JobMovedOn, match="now pending"):
        drv.deck.edit(dead.id, {"priority": 4}, seen)
    assert drv.snapshot(dead.id) == before


def _dead(drv: Driver) -> JobRecord:
    job, _ = drv.deck.enqueue("demo.fail", {"x": 1}, max_retries=0)
    [claimed] = drv.store.claim("w1", drv.now, limit=1, types=["demo.fail"])
    drv.store.fail_many([Outcome(job.id, "w1", attempt=claimed.attempt, error="boom")], drv.now)
    return drv.store.get(job.id)


def test_an_edit_without_seen_is_fenced_on_the_job_as_read_in_its_own_transaction(drv: Driver) -> None:
    """The claim and the edit raced on real threads: an edit that was applied
    was applied before the claim (the claim returns its values); one that
    came after is refused. Never an edit of a running job."""
    for round_ in range(8):
        _claim_races_an_edit(drv, round_)


def _claim_races_an_edit(drv: Driver, round_: int) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"round": round_})

    def one(i: int) -> object:
        if i == 0:
            return drv.store.claim("w1", drv.now, limit=1)
        try:
            return drv.deck.edit(job.id, {"priority": 7})
        except TransitionRefused as exc:
            return exc

    got, edited = race(2, one)
    # On PostgreSQL the claim skips a row the edit holds locked (SKIP LOCKED): the next poll takes it.
    [claimed] = got or drv.store.claim("w1", drv.now, limit=1)
    assert claimed.id == job.id
    if isinstance(edited, TransitionRefused):
        assert claimed.priority == 0 and drv.store.get(job.id).priority == 0
    else:
        assert claimed.priority == 7, "an edit was applied to a job already claimed"
    drv.store.complete_many([Outcome(job.id, "w1", attempt=claimed.attempt)], drv.now)


def test_jobs_no_one_waits_on_cannot_be_edited(drv: Driver) -> None:
    for state in (State.RUNNING, State.COMPLETED, State.DISCARDED):
        job = drv.in_state(state)
        before = drv.snapshot(job.id)
        with pytest.raises(TransitionRefused, match=f"is {state.value}; only pending or failed or dead jobs can be"):
            drv.deck.edit(job.id, {"priority": 1})
        assert drv.snapshot(job.id) == before


def test_a_missing_job_is_not_found(drv: Driver) -> None:
    with pytest.raises(JobNotFound):
        drv.deck.edit(987654, {"priority": 1})


BAD = [
    ({"priority": "urgent"}, "priority"),
    ({"priority": 10**7}, "priority"),
    ({"priority": True}, "priority"),
    ({"queue": ""}, "queue"),
    ({"queue": "a\x00b"}, "queue"),
    ({"queue": "q" * 101}, "queue"),
    ({"queue": 5}, "queue"),
    ({"payload": [1, 2]}, "payload"),
    ({"payload": {"x": float("nan")}}, "payload.x"),
    ({"payload": {"k": "\ud800"}}, "payload.k"),
    ({"run_at": "tomorrow"}, "run_at"),
    ({"run_at": 12}, "run_at"),
    ({"run_at": None}, "run_at"),
    ({"type": "demo.fail"}, "type"),
    ({"max_retries": 9}, "max_retries"),
]


def test_an_edit_is_validated_like_an_enqueue(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    before = drv.snapshot(job.id)
    for data, field in BAD:
        with pytest.raises(InvalidField) as info:
            drv.deck.edit(job.id, data, _seen(job))
        assert info.value.field.startswith(field.split(".")[0]) and field in str(info.value), data
    assert drv.snapshot(job.id) == before


def test_an_edit_payload_has_the_enqueue_limits(drv: Driver) -> None:
    job, _ = drv.deck.enqueue("demo.noop", {"n": 1})
    deep: object = {}
    for _ in range(100):
        deep = {"d": deep}
    with pytest.raises(InvalidField, match="nested deeper"):
        drv.deck.edit(job.id, {"payload": deep})
    with pytest.raises(PayloadTooLarge):
        drv.deck.edit(job.id, {"payload": {"x": "y" * drv.deck.config.max_payload_bytes}})
    assert drv.store.get(job.id).payload == {"n": 1}


def test_job_changes_name_only_what_was_given(drv: Driver) -> None:
    assert drv.deck.job_changes({}) == JobChanges()
    assert drv.deck.job_changes({"priority": "7", "queue": "mail"}).values() == {"priority": 7, "queue": "mail"}
