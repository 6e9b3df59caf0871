"""Cancelling a running job in a real pool (real threads, real databases):
the handler's ``ctx.cancelled`` is set at once by a cancel in this process
and within a heartbeat by another process's; a handler that ignores it ends
at its timeout; either way the job ends ``cancelled``, never retried."""

from __future__ import annotations

import threading

import pytest
from jobdeck.core.errors import Cancelled
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.worker.pool import WorkerPool

from tests.conftest import wait_for

pytestmark = pytest.mark.backends


def _started(pool: WorkerPool, job_id: int) -> bool:
    return job_id in pool.running_jobs()


def test_a_cooperative_handler_stops_at_once_and_the_job_ends_cancelled(make_deck, registry: Registry) -> None:
    seen: list[bool] = []

    @registry.handler("test.waits", max_retries=5)
    def waits(payload: dict, ctx: JobContext) -> None:
        seen.append(ctx.cancelled.wait(30))
        ctx.check_cancelled()

    deck = make_deck()
    job, _ = deck.enqueue("test.waits")
    pool = pool_for(deck, 1, heartbeat_interval=60)  # no beat: this process's cancel alone must reach it
    pool.start()
    try:
        wait_for(lambda: _started(pool, job.id), message="handler started")
        assert deck.cancel(job.id, actor="tester").status is State.RUNNING
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=5, message="ends cancelled")
    finally:
        pool.stop(grace=2)
    assert seen == [True]
    final = deck.store.get(job.id)
    assert final.attempt == 1 and final.retry_count == 0
    (row,) = deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.CANCELLED and "Cancelled" in (row.error or "")


def test_another_process_cancel_reaches_the_handler_by_the_heartbeat(make_deck, registry: Registry) -> None:
    @registry.handler("test.sleeps")
    def sleeps(payload: dict, ctx: JobContext) -> str:
        ctx.cancelled.wait(30)
        return "stopped"  # returns normally: the job still ends cancelled

    deck, other = make_deck(), make_deck()
    job, _ = deck.enqueue("test.sleeps")
    pool = pool_for(deck, 1, heartbeat_interval=0.2)
    pool.start()
    try:
        wait_for(lambda: _started(pool, job.id), message="handler started")
        other.cancel(job.id, actor="elsewhere")  # another deck: another store, no local listener
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=5, message="heard by heartbeat")
    finally:
        pool.stop(grace=2)
    (row,) = deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.CANCELLED


def test_a_handler_that_ignores_the_cancel_is_cancelled_at_its_timeout(make_deck, registry: Registry) -> None:
    release = threading.Event()

    @registry.handler("test.deaf", timeout=0.5, max_retries=3)
    def deaf(payload: dict, ctx: JobContext) -> str:
        release.wait(30)
        return "late"

    deck = make_deck()
    job, _ = deck.enqueue("test.deaf")
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: _started(pool, job.id), message="handler started")
        deck.cancel(job.id, actor="tester")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=5, message="cancelled at timeout")
        release.set()
    finally:
        pool.stop(grace=2)
    final = deck.store.get(job.id)
    assert final.retry_count == 0 and final.attempt == 1
    (row,) = deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.CANCELLED and row.error == "timed out after 0.5 s"


def test_a_held_job_cancelled_before_it_starts_never_runs(make_deck, registry: Registry) -> None:
    ran: list[int] = []

    @registry.handler("test.counted")
    def counted(payload: dict, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    deck = make_deck()
    pool = pool_for(deck, 1)
    job, _ = deck.enqueue("test.counted")
    (claimed,) = deck.store.claim(pool.worker_id, deck.clock(), limit=1)
    deck.cancel(job.id, actor="tester")
    pool.heartbeat_once()  # the beat names it: remembered until it would start
    slot = pool.run_job(claimed)
    assert slot.cancelled.is_set() and ran == []
    pool.flush_acks_once()
    assert deck.store.get(job.id).status is State.CANCELLED


def test_check_cancelled_raises_only_once_cancelled(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop")
    ctx = JobContext(deck.store, job.id, 1, "w", "demo.noop")
    ctx.check_cancelled()
    ctx.cancelled.set()
    with pytest.raises(Cancelled, match=f"job {job.id} was cancelled"):
        ctx.check_cancelled()


def test_demo_sleep_honours_the_cancel(make_deck) -> None:
    deck = make_deck()
    job, _ = deck.enqueue("demo.sleep", {"seconds": 30})
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: _started(pool, job.id), message="demo.sleep started")
        deck.cancel(job.id, actor="tester")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=3, message="sleep stopped")
    finally:
        pool.stop(grace=2)
