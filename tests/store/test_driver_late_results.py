"""A late result is refused on every path: the attempt it reports on was
rescued by the sweep, timed out (and claimed again), or released at
shutdown (and claimed again by the same worker). Refused means no change to
the job and no attempt row; and the attempt now holding the job still
reports fine on the same path, so the refusal is the fence and not a broken
path."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from jobdeck.store import JobRecord, Outcome

from tests.store.driver import DAY, FENCED, LATE, STALL, Driver

pytestmark = pytest.mark.backends

SCENARIOS = ["rescued", "rescued-reclaimed", "timed-out-reclaimed", "released-reclaimed"]
W = "w-late"


def late_setup(drv: Driver, scenario: str, reclaimer: str) -> tuple[JobRecord, JobRecord | None]:
    """Worker ``W`` claims a job, then loses its attempt as ``scenario`` says.
    Returns (the attempt W ran, the attempt now holding the job or None)."""
    job = drv.enqueue(max_retries=3)
    first = drv.claim_one(job, W)
    later = drv.clock.advance(STALL * 2)
    if scenario.startswith("rescued"):
        assert [j.id for j in drv.store.rescue_stalled(later, STALL)] == [job.id]
    elif scenario.startswith("timed-out"):
        outcome = Outcome(job.id, W, attempt=first.attempt, error="timed out after 1 s", kind="timed_out")
        assert [j.id for j in drv.store.fail_many([outcome], later)] == [job.id]
    elif scenario.startswith("released"):
        assert drv.store.release(W, [(job.id, first.attempt)], later) == [job.id]
    else:
        raise AssertionError(scenario)
    current = None
    if scenario.endswith("reclaimed"):
        drv.clock.advance(DAY.total_seconds())
        current = drv.claim_one(job, reclaimer)
        assert current.attempt > first.attempt
    return first, current


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("path", sorted(LATE))
def test_a_late_result_is_refused_and_writes_nothing(drv: Driver, path: str, scenario: str) -> None:
    # The HTTP worker's protocol names no attempt: it cannot tell its own
    # late report from its next claim, so another worker claims the job again.
    reclaimer = W if path in FENCED else "w-next"
    first, current = late_setup(drv, scenario, reclaimer)
    report = LATE[path]
    before = drv.snapshot(first.id)
    assert not report(drv, first, W, first.attempt, drv.clock.advance(1)), f"{path} took a late result ({scenario})"
    after = drv.snapshot(first.id)
    assert after == before, f"{path}: a refused late result changed the job or wrote an attempt row ({scenario})"
    if current is not None:
        assert current.worker_id is not None
        now = drv.clock.advance(1)
        assert report(drv, current, current.worker_id, current.attempt, now), f"{path} refused the live attempt"
        job, rows = drv.snapshot(first.id)
        assert job.attempt == current.attempt
        if job.status is not State.RUNNING:  # a finishing report: one row, of the live attempt
            assert [r.attempt for r in rows[len(before[1]) :]] == [current.attempt]


@pytest.mark.parametrize("path", sorted(LATE))
def test_a_report_from_a_worker_not_holding_the_job_is_refused(drv: Driver, path: str) -> None:
    """The worker fence: another worker naming the very attempt that runs
    (the number alone is guessable) changes nothing; the holder then can."""
    job = drv.enqueue(max_retries=3)
    held = drv.claim_one(job, W)
    report = LATE[path]
    before = drv.snapshot(job.id)
    assert not report(drv, held, "w-intruder", held.attempt, drv.clock.advance(1)), f"{path} took another's report"
    assert drv.snapshot(job.id) == before, f"{path}: a refused report changed the job or wrote an attempt row"
    assert report(drv, held, W, held.attempt, drv.clock.advance(1)), f"{path} refused the holder"
