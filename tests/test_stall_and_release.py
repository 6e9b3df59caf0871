"""The sweeper trusts a worker's own heartbeat, and shutdown's release keeps
the attempts it cut short (both databases)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.models import jobs

pytestmark = pytest.mark.backends


def test_a_live_worker_s_jobs_are_not_rescued_for_a_stale_claim_time(deck: Jobdeck, clock) -> None:
    """A claim stamps heartbeat_at with the time read before it waited for
    the write lock; the worker's own beat is what says it is alive."""
    store = deck.store
    mine, _ = deck.enqueue("demo.noop")
    orphan, _ = deck.enqueue("demo.noop")
    store.register_worker("w-live", "host", 1, 4, clock())
    store.claim("w-live", clock(), limit=1)
    store.claim("w-http", clock(), limit=1)  # an HTTP worker: no workers row, it beats each job
    later = clock() + timedelta(seconds=61)
    store.heartbeat_worker("w-live", later - timedelta(seconds=1))
    with store.write() as conn:  # the claim's stale stamp, as a slow claim leaves it
        conn.execute(jobs.update().where(jobs.c.id == mine.id).values(heartbeat_at=clock()))
    rescued = [j.id for j in store.rescue_stalled(later, stall_timeout=60)]
    assert rescued == [orphan.id], "only the job of the worker that stopped beating is rescued"
    assert store.get(mine.id).status is State.RUNNING
    # Once the worker itself falls silent, its jobs are rescued too.
    rescued = [j.id for j in store.rescue_stalled(later + timedelta(seconds=61), stall_timeout=60)]
    assert rescued == [mine.id]


def test_heartbeat_worker_writes_the_time_it_reads_once_it_holds_the_lock(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.noop")
    deck.store.register_worker("w", "host", 1, 4, clock())
    deck.store.claim("w", clock())
    beat_at = clock() + timedelta(seconds=7)
    assert deck.store.heartbeat_worker("w", lambda: beat_at) == 1
    assert deck.store.get(job.id).heartbeat_at == beat_at
    (worker,) = [w for w in deck.store.list_workers() if w["id"] == "w"]
    assert worker["heartbeat_at"] == beat_at


def test_release_keeps_an_interrupted_attempt_and_counts_no_retry(deck: Jobdeck, clock) -> None:
    started, _ = deck.enqueue("demo.noop", max_retries=2)
    unstarted, _ = deck.enqueue("demo.noop")
    held = [(j.id, j.attempt) for j in deck.store.claim("w", clock(), limit=2)]
    clock.advance(3)
    released = deck.store.release("w", held, clock(), interrupted={started.id: clock() - timedelta(seconds=2)})
    assert sorted(released) == sorted([started.id, unstarted.id])
    cut = deck.store.get(started.id)
    assert (cut.status, cut.attempt, cut.retry_count, cut.worker_id) == (State.PENDING, 1, 0, None)
    (attempt,) = deck.store.attempts_of(started.id)
    assert (attempt.attempt, attempt.outcome, attempt.error) == (1, "interrupted", "interrupted by shutdown")
    assert attempt.duration == 2.0 and attempt.worker_id == "w"
    # The unstarted one keeps its number too (fencing: a number is never handed out twice), with no row.
    assert deck.store.get(unstarted.id).attempt == 1 and deck.store.attempts_of(unstarted.id) == []
    # The next run is the job's second attempt.
    (again,) = [j for j in deck.store.claim("w2", clock(), limit=2) if j.id == started.id]
    assert again.attempt == 2 and again.retry_count == 0


def test_release_finds_the_current_attempt_among_stale_pairs_of_the_same_job(deck: Jobdeck, clock) -> None:
    """A stale (job, attempt) pair listed after the current one of the same
    job once hid it (the pairs went through a dict by job id): the job
    stayed running under a worker that had let it go."""
    job, _ = deck.enqueue("demo.noop", max_retries=2)
    deck.store.claim("w", clock())
    deck.store.release("w", [(job.id, 1)], clock())
    (current,) = deck.store.claim("w", clock())
    assert current.attempt == 2
    released = deck.store.release("w", [(job.id, 2), (job.id, 1)], clock(), interrupted={job.id: clock()})
    assert released == [job.id]
    after = deck.store.get(job.id)
    assert (after.status, after.worker_id) == (State.PENDING, None)
    (row,) = deck.store.attempts_of(job.id)
    assert (row.attempt, row.outcome) == (2, "interrupted"), "the row names the attempt released, not the stale one"
