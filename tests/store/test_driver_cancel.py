"""Cancel on both databases: pending and failed jobs are cancelled at once,
a running one carries a cancel request until its attempt ends, and every
way an attempt ends (complete with or without a result, batched or single
or HTTP, fail, timeout, stall, release) then ends the job ``cancelled``,
with an attempt row saying so, never retried and never claimed again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from jobdeck.core.errors import TransitionRefused
from jobdeck.core.states import ALL_STATES, SOURCES, AttemptOutcome, State, Transition, refusal
from jobdeck.store import JobRecord, Outcome

from tests.store.driver import DAY, STALL, Driver

pytestmark = pytest.mark.backends

W = "w-cancel"


@pytest.mark.parametrize("state", [State.PENDING, State.FAILED], ids=lambda s: s.value)
def test_a_job_not_running_is_cancelled_at_once(drv: Driver, state: State) -> None:
    job = drv.in_state(state)
    cancelled = drv.store.cancel(job.id, drv.now)
    assert cancelled.status is State.CANCELLED
    assert cancelled.finished_at == drv.now and cancelled.cancel_requested_at == drv.now
    assert drv.store.claim("claimer", drv.now + DAY, limit=100) == []


@pytest.mark.parametrize("state", [s for s in ALL_STATES if s not in SOURCES[Transition.CANCEL]], ids=str)
def test_a_cancel_is_refused_for_dead_and_finished_jobs(drv: Driver, state: State) -> None:
    job = drv.in_state(state)
    before = drv.snapshot(job.id)
    with pytest.raises(TransitionRefused) as info:
        drv.store.cancel(job.id, drv.now)
    assert str(info.value) == refusal(job.id, state, Transition.CANCEL)
    assert f"is {state.value}; only pending or running or failed or blocked jobs can be cancelled" in str(info.value)
    assert drv.snapshot(job.id) == before


def _running_with_cancel(drv: Driver) -> JobRecord:
    job = drv.claim_one(drv.enqueue(max_retries=3), W)
    requested = drv.store.cancel(job.id, drv.now)
    assert requested.status is State.RUNNING and requested.cancel_requested_at == drv.now
    assert requested.worker_id == W and requested.attempt == job.attempt
    return job


def _complete_many(drv: Driver, job: JobRecord) -> None:
    assert drv.store.complete_many([Outcome(job.id, W, attempt=job.attempt)], drv.now) == [job.id]


def _complete_many_with_others(drv: Driver, job: JobRecord) -> None:
    """One batched completion where one job was cancelled and one was not."""
    other = drv.claim_one(drv.enqueue(), W)
    outcomes = [Outcome(job.id, W, attempt=job.attempt), Outcome(other.id, W, attempt=other.attempt)]
    assert sorted(drv.store.complete_many(outcomes, drv.now)) == sorted([job.id, other.id])
    assert drv.store.get(other.id).status is State.COMPLETED
    assert [a.outcome for a in drv.store.attempts_of(other.id)] == [AttemptOutcome.COMPLETED]


def _complete_result(drv: Driver, job: JobRecord) -> None:
    assert drv.store.complete_many([Outcome(job.id, W, attempt=job.attempt, result={"r": 1})], drv.now)


def _complete_and_claim(drv: Driver, job: JobRecord) -> None:
    accepted, _ = drv.store.complete_and_claim([Outcome(job.id, W, attempt=job.attempt)], W, drv.now, limit=0)
    assert accepted == [job.id]


def _complete_single(drv: Driver, job: JobRecord) -> None:
    assert drv.store.complete(job.id, W, drv.now).status is State.CANCELLED


def _http_complete(drv: Driver, job: JobRecord) -> None:
    r = drv.client.post(f"/api/jobs/{job.id}/complete", json={"worker_id": W})
    assert r.status_code == 200 and r.get_json()["status"] == "cancelled"


def _fail_many(drv: Driver, job: JobRecord) -> None:
    (failed,) = drv.store.fail_many([Outcome(job.id, W, attempt=job.attempt, error="boom")], drv.now)
    assert failed.status is State.CANCELLED


def _fail_not_retryable(drv: Driver, job: JobRecord) -> None:
    assert drv.store.fail(job.id, W, "fatal", drv.now, retryable=False).status is State.CANCELLED


def _http_fail(drv: Driver, job: JobRecord) -> None:
    r = drv.client.post(f"/api/jobs/{job.id}/fail", json={"worker_id": W, "error": "stopped"})
    assert r.status_code == 200 and r.get_json()["status"] == "cancelled"


def _timeout(drv: Driver, job: JobRecord) -> None:
    outcome = Outcome(job.id, W, attempt=job.attempt, error="timed out after 1 s", kind="timed_out")
    assert [j.status for j in drv.store.fail_many([outcome], drv.now)] == [State.CANCELLED]


def _stall(drv: Driver, job: JobRecord) -> None:
    rescued = drv.store.rescue_stalled(drv.now + timedelta(seconds=STALL * 2), STALL)
    assert [(j.id, j.status) for j in rescued] == [(job.id, State.CANCELLED)]


def _release(drv: Driver, job: JobRecord) -> None:
    assert drv.store.release(W, [(job.id, job.attempt)], drv.now, interrupted={job.id: drv.now}) == [job.id]


ENDINGS: dict[str, Callable[[Driver, JobRecord], None]] = {
    "complete_many": _complete_many, "complete_many_mixed": _complete_many_with_others,
    "complete_result": _complete_result, "complete_and_claim": _complete_and_claim,
    "complete": _complete_single, "http_complete": _http_complete, "fail_many": _fail_many,
    "fail_not_retryable": _fail_not_retryable, "http_fail": _http_fail, "timeout": _timeout,
    "stall": _stall, "release": _release,
}  # fmt: skip


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_running_job_cancelled_ends_cancelled_however_its_attempt_ends(drv: Driver, ending: str) -> None:
    job = _running_with_cancel(drv)
    ENDINGS[ending](drv, job)
    got = drv.store.get(job.id)
    assert got.status is State.CANCELLED, ending
    assert got.retry_count == 0 and got.finished_at is not None
    (row,) = drv.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.CANCELLED and row.attempt == job.attempt and row.error
    assert job.id not in [j.id for j in drv.store.claim("claimer", drv.now + DAY * 30, limit=100)]


def test_a_second_cancel_of_a_running_job_keeps_the_first_request(drv: Driver) -> None:
    job = _running_with_cancel(drv)
    first = drv.now
    drv.clock.advance(5)
    again = drv.store.cancel(job.id, drv.now)
    assert again.status is State.RUNNING and again.cancel_requested_at == first


def test_a_late_result_after_the_cancel_ended_the_job_is_refused(drv: Driver) -> None:
    job = _running_with_cancel(drv)
    _timeout(drv, job)
    assert drv.store.complete_many([Outcome(job.id, W, attempt=job.attempt)], drv.now) == []
    assert len(drv.store.attempts_of(job.id)) == 1


def test_the_worker_heartbeat_names_the_held_jobs_cancelled(drv: Driver) -> None:
    job = _running_with_cancel(drv)
    other = drv.claim_one(drv.enqueue(), W)
    beaten, cancelled = drv.store.heartbeat_worker_with_cancels(W, drv.now)
    assert beaten == 2 and cancelled == [job.id]
    assert drv.store.heartbeat_worker_with_cancels("w-else", drv.now) == (0, [])
    assert drv.store.heartbeat_worker(W, drv.now) == 2
    assert drv.store.get(other.id).cancel_requested_at is None


def test_the_http_heartbeat_answers_cancel(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    r = drv.client.post(f"/api/jobs/{job.id}/heartbeat", json={"worker_id": W})
    assert r.status_code == 200 and r.get_json()["cancel"] is False
    drv.store.cancel(job.id, drv.now)
    r = drv.client.post(f"/api/jobs/{job.id}/heartbeat", json={"worker_id": W})
    assert r.status_code == 200 and r.get_json()["cancel"] is True and r.get_json()["status"] == "running"


def test_cancel_ids_cancels_what_it_can_and_requests_the_running(drv: Driver) -> None:
    pending = drv.in_state(State.PENDING)
    running = drv.in_state(State.RUNNING)
    dead = drv.in_state(State.DEAD)
    heard: list[list[int]] = []
    drv.store.on_cancel(heard.append)
    assert sorted(drv.store.cancel_ids([pending.id, running.id, dead.id], drv.now)) == sorted([pending.id, running.id])
    assert drv.store.get(pending.id).status is State.CANCELLED
    assert drv.store.get(running.id).status is State.RUNNING
    assert drv.store.get(dead.id).status is State.DEAD
    assert heard == [[running.id]]
