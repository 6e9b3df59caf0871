"""Every transition from every state, allowed and refused, driven by the
state module's own table (so a change there is a change here)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from jobdeck.core.errors import RunNowRefused, TransitionRefused
from jobdeck.core.states import ALL_STATES, SOURCES, TARGETS, State, Transition, refusal
from jobdeck.deck import Jobdeck
from jobdeck.store.lifecycle import JobChanges
from jobdeck.store.models import job_dependencies, jobs
from sqlalchemy import insert, update

from tests.helpers import force_state

pytestmark = pytest.mark.backends


def _claim(deck: Jobdeck, job_id: int) -> State | None:
    got = deck.store.claim("w2", deck.clock(), limit=10)
    return State.RUNNING if any(j.id == job_id for j in got) else None


def _complete(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.complete(job_id, "w1", deck.clock()).status


def _fail(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.fail(job_id, "w1", "boom", deck.clock()).status


def _heartbeat(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.heartbeat(job_id, "w1", deck.clock()).status


def _release(deck: Jobdeck, job_id: int) -> State | None:
    job = deck.store.get(job_id)
    done = deck.store.release("w1", [(job_id, job.attempt)], deck.clock())
    return State.PENDING if done else None


def _rescue(deck: Jobdeck, job_id: int) -> State | None:
    deck.clock.advance(3600)  # type: ignore[attr-defined]
    rescued = deck.store.rescue_stalled(deck.clock(), stall_timeout=60)
    return next((j.status for j in rescued if j.id == job_id), None)


def _retry(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.retry(job_id, deck.clock()).status


def _discard(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.discard(job_id, deck.clock()).status


def _run_now(deck: Jobdeck, job_id: int) -> State | None:
    with deck.store.write() as conn:  # scheduled: run now moves only jobs not yet due
        later = deck.clock() + timedelta(hours=1)
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(available_at=later))
    return deck.store.run_now(job_id, deck.clock()).status


def _cancel(deck: Jobdeck, job_id: int) -> State | None:
    return deck.cancel(job_id, actor="test").status


def _edit(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.edit(job_id, deck.clock(), JobChanges(priority=7)).after.status


def _snooze(deck: Jobdeck, job_id: int) -> State | None:
    return deck.store.snooze(job_id, "w1", 30, deck.clock()).status


def _promote(deck: Jobdeck, job_id: int) -> State | None:
    """Make the job wait on one new job of its workflow, then complete that one."""
    before = deck.store.get(job_id).status
    dep, _ = deck.enqueue("demo.noop", priority=100)
    with deck.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_([job_id, dep.id])).values(workflow_id=1))
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(deps_left=1))
        conn.execute(insert(job_dependencies).values(job_id=job_id, depends_on=dep.id))
    (claimed,) = deck.store.claim("w3", deck.clock(), limit=1)
    assert claimed.id == dep.id
    deck.store.complete(dep.id, "w3", deck.clock())
    after = deck.store.get(job_id).status
    return after if after is not before else None


DO: dict[Transition, Callable[[Jobdeck, int], State | None]] = {
    Transition.CLAIM: _claim,
    Transition.COMPLETE: _complete,
    Transition.FAIL: _fail,
    Transition.HEARTBEAT: _heartbeat,
    Transition.RELEASE: _release,
    Transition.RESCUE: _rescue,
    Transition.RETRY: _retry,
    Transition.DISCARD: _discard,
    Transition.RUN_NOW: _run_now,
    Transition.CANCEL: _cancel,
    Transition.EDIT: _edit,
    Transition.SNOOZE: _snooze,
    Transition.PROMOTE: _promote,
}
# Transitions that report a refusal by doing nothing rather than raising.
SILENT = {Transition.CLAIM, Transition.RELEASE, Transition.RESCUE, Transition.PROMOTE}


def test_every_transition_has_a_test() -> None:
    assert set(DO) == set(Transition) == set(SOURCES) == set(TARGETS)


@pytest.mark.parametrize("transition", list(Transition), ids=lambda t: t.value)
@pytest.mark.parametrize("state", ALL_STATES, ids=lambda s: s.value)
def test_transition(deck: Jobdeck, transition: Transition, state: State) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=2)
    force_state(deck, job.id, state)
    allowed = state in SOURCES[transition]
    if allowed:
        result = DO[transition](deck, job.id)
        assert result in TARGETS[transition], f"{transition} from {state} gave {result}"
        assert deck.store.get(job.id).status == result
    elif transition in SILENT:
        assert DO[transition](deck, job.id) is None
        assert deck.store.get(job.id).status is state
    else:
        with pytest.raises(TransitionRefused) as info:
            DO[transition](deck, job.id)
        expected = RunNowRefused(job.id, state) if transition is Transition.RUN_NOW else None
        assert str(info.value) == (str(expected) if expected else refusal(job.id, state, transition))
        assert deck.store.get(job.id).status is state


def test_refusal_message_reads_well() -> None:
    assert refusal(42, State.COMPLETED, Transition.FAIL) == "job 42 is completed; only running jobs can be failed"
    assert (
        refusal(7, State.RUNNING, Transition.DISCARD)
        == "job 7 is running; only pending or failed or dead jobs can be discarded"
    )


def test_check_constraint_rejects_unknown_status(deck: Jobdeck) -> None:
    from sqlalchemy.exc import IntegrityError

    job, _ = deck.enqueue("demo.noop")
    with pytest.raises(IntegrityError), deck.store.write() as conn:
        conn.exec_driver_sql(f"UPDATE jobs SET status = 'lost' WHERE id = {job.id}")


def test_workflow_and_batch_states_are_enums_whose_ended_values_are_job_states() -> None:
    """A workflow's state is read from its jobs' counts; each ended value is
    the job state of that name, and only ``held`` is a word of its own."""
    from jobdeck.core.states import LIVE_GROUP, BatchState, GroupState
    from jobdeck.store.graph import group_state

    assert {g.value for g in GroupState} - {s.value for s in State} == {"held"}
    assert group_state({"completed": 2}) is GroupState.COMPLETED
    assert group_state({"completed": 1, "dead": 1}) is GroupState.DEAD
    assert group_state({"completed": 1, "discarded": 1}) is GroupState.CANCELLED
    assert group_state({"completed": 1, "blocked": 1}) is GroupState.HELD
    assert group_state({"pending": 1, "blocked": 1}) is GroupState.RUNNING
    assert {GroupState.RUNNING, GroupState.HELD} == LIVE_GROUP
    assert [str(b) for b in BatchState] == ["open", "running", "fired"]
    assert f"{GroupState.HELD}" == "held"
