"""The stalled sweep and the heartbeats it goes by: a worker's heartbeat
vouches for the jobs it holds and for its own row, nothing of another
worker's; the sweep rescues a job only when both the job's heartbeat and
its worker's row are old."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.core.states import State

from tests.store.driver import STALL, Driver

pytestmark = pytest.mark.backends


def test_a_worker_heartbeat_vouches_for_its_own_jobs_only(drv: Driver) -> None:
    t0 = drv.now
    for worker in ("w-live", "w-silent"):
        drv.store.register_worker(worker, "host", 1, 1, t0)
    live = drv.claim_one(drv.enqueue(), "w-live")
    silent = drv.claim_one(drv.enqueue(), "w-silent")
    later = drv.clock.advance(STALL * 2)
    assert drv.store.heartbeat_worker("w-live", later) == 1, "a worker's beat touched a job it does not hold"
    assert drv.store.get(silent.id).heartbeat_at == silent.heartbeat_at
    assert [j.id for j in drv.store.rescue_stalled(later, STALL)] == [silent.id]
    assert drv.store.get(live.id).status is State.RUNNING


def test_the_sweep_spares_a_job_whose_worker_still_beats(drv: Driver) -> None:
    """A claim stamps the job's heartbeat with the time the claimer read
    before it waited for the write lock: the job's own heartbeat can look
    stalled while its worker's row, beaten just now, says it is alive."""
    t0 = drv.now
    stale = t0 - timedelta(seconds=STALL * 2)
    drv.store.register_worker("w", "host", 1, 1, t0)
    job = drv.claim_one(drv.enqueue(available_at=stale), "w", now=stale)
    assert drv.store.rescue_stalled(t0, STALL) == [], "rescued the job of a worker still heart-beating"
    assert drv.store.get(job.id).status is State.RUNNING
    later = drv.clock.advance(STALL * 2)  # the worker stopped beating
    assert [j.id for j in drv.store.rescue_stalled(later, STALL)] == [job.id]


def test_the_sweep_picks_only_running_jobs(drv: Driver) -> None:
    """Finished jobs keep their last heartbeat: a sweep that picked them
    (the fail rule then refusing each) spent its batch on them and left the
    stalled job behind."""
    for _ in range(3):
        drv.in_state(State.COMPLETED)
    stalled = drv.claim_one(drv.enqueue(), "w-stalled")
    later = drv.clock.advance(STALL * 2)
    assert [j.id for j in drv.store.rescue_stalled(later, STALL, limit=1)] == [stalled.id]
