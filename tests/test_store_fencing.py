"""Late and lost-race results are refused: focused regressions for what the
state-machine property test (tests/adversarial/test_store_state_machine.py)
found, on both databases and on the batched and single paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.errors import TransitionRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from sqlalchemy import event

pytestmark = pytest.mark.backends


def test_a_released_attempt_number_is_not_handed_out_again(deck: Jobdeck, clock) -> None:
    """The released attempt's late result must not complete the same
    worker's next claim of the job: the fence (job, attempt, worker) needs a
    fresh attempt number."""
    job, _ = deck.enqueue("demo.noop")
    (first,) = deck.store.claim("w", clock())
    deck.store.release("w", [(job.id, first.attempt)], clock())
    (second,) = deck.store.claim("w", clock())
    assert second.attempt == first.attempt + 1
    assert deck.store.complete_many([Outcome(job.id, "w", attempt=first.attempt)], clock()) == []
    assert deck.store.fail_many([Outcome(job.id, "w", attempt=first.attempt, error="late")], clock()) == []
    assert deck.store.get(job.id).status is State.RUNNING
    assert deck.store.complete_many([Outcome(job.id, "w", attempt=second.attempt)], clock()) == [job.id]


@pytest.mark.parametrize("with_result", [False, True], ids=["no-result", "with-result"])
def test_a_late_outcome_in_the_same_batch_gets_no_attempt_row(deck: Jobdeck, clock, with_result: bool) -> None:
    """A batch holding the current attempt's completion and a stale one of
    the same job completes the job once and records one attempt row (SQLite:
    the fast path without a result, Core with one), not a
    "completed" row for the attempt that had already failed."""
    job, _ = deck.enqueue("demo.noop", max_retries=1)
    (first,) = deck.store.claim("w", clock())
    deck.store.fail_many([Outcome(job.id, "w", attempt=first.attempt, error="boom")], clock())
    deck.store.retry(job.id, clock())
    (second,) = deck.store.claim("w", clock())
    result = {"ok": 1} if with_result else None
    batch = [Outcome(job.id, "w", attempt=a, result=result) for a in (second.attempt, first.attempt, second.attempt)]
    assert deck.store.complete_many(batch, clock()) == [job.id]
    rows = [(a.attempt, a.outcome) for a in deck.store.attempts_of(job.id)]
    assert rows == [(first.attempt, "failed"), (second.attempt, "completed")]


@contextmanager
def after_next_transaction(deck: Jobdeck, competitor: Callable[[], Any]) -> Iterator[list[Any]]:
    """Run ``competitor`` once, right after the next transaction of this
    store ends (its connection goes back to the pool): a deterministic
    interleaving for a call that checks in one transaction and writes in
    another, which is the race a second process wins now and then."""
    pool = deck.store.engine.pool
    ran: list[Any] = []

    def on_checkin(*_: Any) -> None:
        if not ran:
            ran.append(None)
            ran[0] = competitor()

    event.listen(pool, "checkin", on_checkin)
    try:
        yield ran
    finally:
        event.remove(pool, "checkin", on_checkin)


def _stalled_and_reclaimed(deck: Jobdeck, clock, job_id: int) -> Callable[[], Any]:
    """The competitor: the sweep rescues the job and the same worker claims it again."""

    def compete() -> Any:
        later = clock() + timedelta(seconds=120)
        rescued = deck.store.rescue_stalled(later, stall_timeout=60)
        claimed = deck.store.claim("w", later + timedelta(seconds=3600), controlled=False)
        return rescued, claimed

    return compete


@pytest.mark.parametrize("call", ["complete", "fail"])
def test_a_single_call_that_loses_the_race_answers_409(deck: Jobdeck, clock, call: str) -> None:
    """The HTTP worker's complete and fail must check and write in one
    transaction: the job may be rescued (and re-claimed) in between, and a
    call that changed nothing answered 200 with the job as it then stood, or
    failed the next attempt of the job."""
    job, _ = deck.enqueue("demo.noop", max_retries=3)
    (first,) = deck.store.claim("w", clock())
    with after_next_transaction(deck, _stalled_and_reclaimed(deck, clock, job.id)) as ran:
        try:
            if call == "complete":
                answered = deck.store.complete(job.id, "w", clock())
            else:
                answered = deck.store.fail(job.id, "w", "boom", clock())
        except TransitionRefused:
            answered = None
    assert ran, "the competitor did not run"
    now = deck.store.get(job.id)
    mine = [a for a in deck.store.attempts_of(job.id) if a.outcome in ("completed", "failed")]
    if answered is None:  # refused: nothing of the call was applied
        assert mine == []
    else:  # accepted: applied to the attempt it checked, before the competitor
        assert answered.status is (State.COMPLETED if call == "complete" else State.FAILED)
        assert [a.attempt for a in mine] == [first.attempt]
        assert now.attempt == first.attempt or now.status is State.RUNNING


def test_a_heartbeat_that_beats_the_sweep_keeps_the_job(deck: Jobdeck, clock) -> None:
    """The sweep must pick and rescue a stalled job in one transaction: picked
    in one and rescued in another, a heartbeat landing in between was
    accepted and the job rescued anyway (run twice, its worker alive)."""
    job, _ = deck.enqueue("demo.noop", max_retries=3)
    deck.store.claim("w", clock())
    later = clock() + timedelta(seconds=120)

    def heartbeat() -> Any:
        try:
            return deck.store.heartbeat(job.id, "w", later)
        except TransitionRefused as exc:
            return exc

    with after_next_transaction(deck, heartbeat) as beat:
        rescued = deck.store.rescue_stalled(later, stall_timeout=60)
    assert beat, "the heartbeat did not run"
    now = deck.store.get(job.id)
    if rescued:  # the sweep won: the heartbeat came too late
        assert isinstance(beat[0], TransitionRefused), f"heartbeat accepted, then the job was rescued: {now.status}"
        assert now.status is State.FAILED
    else:  # the heartbeat won: the job runs on
        assert beat[0].status is State.RUNNING and now.status is State.RUNNING
