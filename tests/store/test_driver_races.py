"""Complete losing a race: the sweep rescues the job (and another worker
claims it) between the completing call's check and its write. No path may
answer success unless the job became completed by that call: the HTTP
worker's ``POST /api/jobs/<id>/complete`` answers 409, ``Store.complete``
raises ``TransitionRefused``/``NotHeld``, the batched paths leave the id out.

Two ways to make the race: a competitor run right after the call's first
statement (deterministic: a check that does not lock what it read loses
every time), and two threads racing for many rounds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.states import State

from tests.store.driver import (
    LATE,
    STALL,
    Driver,
    competitor_after_first_statement,
    competitor_after_first_transaction,
    complete,
    complete_and_claim,
    complete_many,
    complete_many_result,
    fail,
    fail_many,
    http_complete,
    http_fail,
)

pytestmark = pytest.mark.backends

FINISHING = {
    "complete_many": complete_many, "complete_many_result": complete_many_result,
    "complete_and_claim": complete_and_claim, "complete": complete, "http_complete": http_complete,
    "fail_many": fail_many, "fail": fail, "http_fail": http_fail,
}  # fmt: skip
assert set(FINISHING) <= set(LATE)


def rescue_and_reclaim(drv: Driver, job_id: int, at: Any) -> Callable[[], Any]:
    def compete() -> Any:
        rescued = drv.store.rescue_stalled(at, STALL)
        claimed = drv.store.claim("w-next", at + timedelta(days=1), controlled=False)
        return rescued, claimed

    return compete


def check_outcome(drv: Driver, path: str, job_id: int, attempt: int, answered: bool) -> None:
    job, rows = drv.snapshot(job_id)
    mine = [r for r in rows if r.attempt == attempt and r.worker_id == "w" and r.outcome in ("completed", "failed")]
    if answered:  # it won: the job finished by this call, as this attempt
        assert job.attempt == attempt or job.status is State.RUNNING, f"{path}: answered success, then lost the job"
        assert len(mine) == 1, f"{path} answered success but wrote {len(mine)} attempt rows for its attempt"
        if path.startswith(("complete", "http_complete")):
            assert job.status is State.COMPLETED or job.attempt > attempt
    else:  # it lost: nothing of it applied
        assert mine == [], f"{path} was refused but wrote an attempt row"


@pytest.mark.parametrize("when", ["after-first-statement", "after-first-transaction"])
@pytest.mark.parametrize("path", sorted(FINISHING))
def test_a_finishing_call_that_loses_the_race_does_not_answer_success(drv: Driver, path: str, when: str) -> None:
    job = drv.enqueue(max_retries=3)
    first = drv.claim_one(job, "w")
    at = drv.now + timedelta(seconds=STALL * 2)
    drv.clock.now = at
    stores, compete = [drv.store, drv.policy], rescue_and_reclaim(drv, job.id, at)
    if when == "after-first-statement":
        # Waiting longer than this means the competitor is blocked behind the call's lock: the right outcome.
        interleave = competitor_after_first_statement(stores, compete, wait=0.5)
    else:
        interleave = competitor_after_first_transaction(stores, compete)
    with interleave as ran:
        answered = FINISHING[path](drv, first, "w", first.attempt, at)
    assert ran, "the competitor did not run"
    assert not isinstance(ran[0], Exception), ran[0]
    rescued, _ = ran[0]
    assert answered != bool(rescued), f"{path}: answered {answered} and the sweep rescued {len(rescued)}"
    check_outcome(drv, path, job.id, first.attempt, answered)


CHECKING = ["complete", "fail", "http_complete", "http_fail"]
"""The HTTP worker's complete and fail: they check the job is theirs first."""


@pytest.mark.parametrize("when", ["after-first-statement", "after-first-transaction"])
@pytest.mark.parametrize("path", CHECKING)
def test_a_sweep_arriving_after_the_check_cannot_take_the_job(drv: Driver, path: str, when: str) -> None:
    """The check and the transition are one transaction, the row locked
    (PostgreSQL; SQLite: the write lock): a sweep that comes after the check
    skips or waits for the job, and the call that found it held wins."""
    job = drv.enqueue(max_retries=3)
    first = drv.claim_one(job, "w")
    at = drv.now + timedelta(seconds=STALL * 2)
    drv.clock.now = at
    stores, compete = [drv.store, drv.policy], rescue_and_reclaim(drv, job.id, at)
    if when == "after-first-statement":
        interleave = competitor_after_first_statement(stores, compete, wait=0.5)
    else:
        interleave = competitor_after_first_transaction(stores, compete)
    with interleave as ran:
        answered = FINISHING[path](drv, first, "w", first.attempt, at)
    assert ran and not isinstance(ran[0], Exception), ran
    rescued, _ = ran[0]
    assert answered and not rescued, f"{path}: the sweep took the job between the check and the write ({when})"
    check_outcome(drv, path, job.id, first.attempt, answered)


def test_http_complete_answers_409_when_the_job_was_rescued_first(drv: Driver) -> None:
    job = drv.enqueue(max_retries=3)
    drv.claim_one(job, "w")
    drv.clock.advance(STALL * 2)
    assert [j.id for j in drv.store.rescue_stalled(drv.now, STALL)] == [job.id]
    r = drv.client.post(f"/api/jobs/{job.id}/complete", json={"worker_id": "w"})
    assert r.status_code == 409 and r.get_json()["status"] == State.FAILED.value
    drv.clock.advance(86400)
    drv.store.claim("w-next", drv.now, queues=[job.queue])
    r = drv.client.post(f"/api/jobs/{job.id}/complete", json={"worker_id": "w"})
    assert r.status_code == 409
    assert drv.store.get(job.id).status is State.RUNNING


@pytest.mark.parametrize("path", ["http_complete", "complete", "complete_many"])
def test_completion_racing_the_sweep_on_two_threads(drv: Driver, path: str) -> None:
    """Many rounds of a real race: whoever wins, the answers agree with the row."""
    report = FINISHING[path]
    wins = {"call": 0, "sweep": 0}
    for _ in range(15):
        job = drv.enqueue(max_retries=3)
        first = drv.claim_one(job, "w")
        at = drv.clock.advance(STALL * 2)
        barrier = threading.Barrier(2)
        out: dict[str, Any] = {}

        def call(job=job, first=first, at=at, barrier=barrier, out=out) -> None:  # type: ignore[no-untyped-def]
            barrier.wait(10)
            out["answered"] = report(drv, first, "w", first.attempt, at)

        def sweep(at=at, barrier=barrier, out=out) -> None:  # type: ignore[no-untyped-def]
            barrier.wait(10)
            out["rescued"] = [j.id for j in drv.store.rescue_stalled(at, STALL)]

        threads = [threading.Thread(target=call), threading.Thread(target=sweep)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert set(out) == {"answered", "rescued"}, f"a racer failed: {out}"
        assert out["answered"] != (job.id in out["rescued"]), out
        wins["call" if out["answered"] else "sweep"] += 1
        check_outcome(drv, path, job.id, first.attempt, out["answered"])
        drv.clock.advance(1)
    print(f"{path}: {wins}")
