"""Completing a batch and claiming the next in one transaction
(``Store.complete_and_claim``, the worker pool's acker refill): the
completions' fencing and attempt rows, the claim's order and no-double-claim,
the claim policy, atomicity, and a pool that stops mid-drain losing nothing."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.runtime import pool_for
from jobdeck.store import Outcome
from jobdeck.worker import acks
from jobdeck.worker.pool import WorkerPool

from tests.conftest import all_in, wait_for
from tests.helpers import completions

pytestmark = pytest.mark.backends


def test_completes_fenced_records_attempts_and_claims_the_next_in_order(deck: Jobdeck, clock) -> None:
    ids = deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(6)])
    a, b, c = deck.store.claim("w", clock(), limit=3)
    stale = Outcome(c.id, "w", attempt=c.attempt + 1, started_at=clock())  # an attempt that is not the current one
    accepted, claimed = deck.store.complete_and_claim(completions([a, b]) + [stale], "w", clock(), limit=2)
    assert sorted(accepted) == sorted([a.id, b.id])
    assert [j.id for j in claimed] == ids[3:5]
    assert all(j.status is State.RUNNING and j.worker_id == "w" and j.attempt == 1 for j in claimed)
    assert [(x.attempt, x.outcome) for x in deck.store.attempts_of(a.id)] == [(1, "completed")]
    assert deck.store.attempts_of(c.id) == [] and deck.store.get(c.id).status is State.RUNNING
    assert deck.store.get(a.id).status is State.COMPLETED
    # Nothing more than the limit, and a zero limit only completes.
    assert deck.store.complete_and_claim(completions([c]), "w", clock(), limit=0) == ([c.id], [])
    assert deck.store.get(ids[5]).status is State.PENDING


def test_both_or_neither(deck: Jobdeck, clock) -> None:
    deck.enqueue_many([{"type": "demo.noop"}] * 3)
    (held,) = deck.store.claim("w", clock(), limit=1)

    def broken_policy(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("claim failed")

    deck.store.claim_policy = broken_policy
    with pytest.raises(RuntimeError):
        deck.store.complete_and_claim(completions([held]), "w", clock(), limit=2)
    deck.store.claim_policy = None
    assert deck.store.get(held.id).status is State.RUNNING and deck.store.attempts_of(held.id) == []
    # The store is usable afterwards (no transaction left joined).
    accepted, claimed = deck.store.complete_and_claim(completions([held]), "w", clock(), limit=2)
    assert accepted == [held.id] and len(claimed) == 2


def test_the_claim_policy_sees_the_completions_and_skips_paused_queues(deck: Jobdeck, clock) -> None:
    controls = QueueControls(deck.store, Limits(queues={}, types={"demo.noop": 2}), refresh=0)
    controls.install()
    controls.set_paused("other", True, clock(), "test")
    paused, _ = deck.enqueue("demo.noop", queue="other")
    deck.enqueue_many([{"type": "demo.noop"}] * 4)
    first = deck.store.claim("w", clock(), limit=10)
    assert len(first) == 2  # the type's limit
    # One of the two completes in the same transaction: room for exactly one more.
    _, claimed = deck.store.complete_and_claim(completions(first[:1]), "w", clock(), limit=10)
    assert len(claimed) == 1 and paused.id not in {j.id for j in claimed}
    assert deck.store.get(paused.id).status is State.PENDING


def test_concurrent_refills_claim_each_job_exactly_once(deck: Jobdeck, make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(1000)])
    stores = [deck.store, make_deck(clock=clock).store]
    claimed: list[int] = []
    lock = threading.Lock()

    def refiller(n: int) -> None:
        store, worker = stores[n % 2], f"w{n}"
        held = store.claim(worker, clock(), limit=7, types=["demo.noop"])
        while held:
            with lock:
                claimed.extend(j.id for j in held)
            accepted, held = store.complete_and_claim(
                completions(held, worker), worker, clock(), limit=13, types=["demo.noop"]
            )
            assert len(accepted) == len(set(accepted))

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(refiller, n) for n in range(4)]:
            f.result()  # re-raises a refiller's failure
    assert len(claimed) == 1000 and len(set(claimed)) == 1000
    assert deck.store.counts(clock())[State.COMPLETED.value] == 1000


def test_a_pool_stopped_mid_drain_loses_nothing(live_deck: Jobdeck) -> None:
    n = 1500
    live_deck.enqueue_many([{"type": "demo.noop"}] * n)
    pool = pool_for(live_deck, 4)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.counts(live_deck.clock())[State.COMPLETED.value] >= 200, timeout=20)
    finally:
        # Room enough for a starved machine: stop returns once its running
        # jobs end and their outcomes are written. Given 5 s, a quick tier at
        # nice 10 beside the full run gave up on one job (its outcome kept in
        # the spool for the next pool, as a stop past its grace must).
        pool.stop(grace=30)
    counts = live_deck.store.counts(live_deck.clock())
    assert counts[State.RUNNING.value] == 0 and pool.inflight == 0
    assert counts[State.COMPLETED.value] + counts[State.PENDING.value] == n


ELSEWHERE = "elsewhere"
"""The queue the pools of the held-jobs tests serve: they claim nothing of
the default queue themselves, so the tests decide what each one holds."""


def _hold(pool: WorkerPool, deck: Jobdeck, n: int) -> list[int]:
    """Claim ``n`` jobs for ``pool`` and leave them held for its next claim,
    as a refill does when the next batch of outcomes is already waiting."""
    ids = deck.enqueue_many([{"type": "demo.noop"}] * n)
    with pool.acker.refill_lock:
        claimed = deck.store.claim(pool.worker_id, deck.clock(), limit=n)
        pool.holdings.claimed(claimed)
        pool.acker.held = claimed
    assert sorted(j.id for j in claimed) == sorted(ids)
    return ids


def test_jobs_held_for_the_next_claim_are_given_back_at_stop(live_deck: Jobdeck) -> None:
    """Held jobs are neither queued nor started: stop releases them with the
    queued ones (pending, no attempt counted), never leaves them running."""
    pool = pool_for(live_deck, 2, queues=[ELSEWHERE])
    pool.start()
    try:
        ids = _hold(pool, live_deck, 3)
    finally:
        pool.stop(grace=5)
    for job_id in ids:
        job = live_deck.store.get(job_id)
        assert (job.status, job.worker_id, job.attempt) == (State.PENDING, None, 1)
        assert live_deck.store.attempts_of(job_id) == []
    assert pool.inflight == 0


def test_held_jobs_run_when_the_next_batch_has_no_completion(live_deck: Jobdeck) -> None:
    """The next acknowledgement may hold only failures (no refill, no claim
    statement): the held jobs are queued at its end all the same."""
    pool = pool_for(live_deck, 2, queues=[ELSEWHERE])
    pool.start()
    try:
        ids = _hold(pool, live_deck, 3)
        (failing,) = live_deck.enqueue_many([{"type": "demo.noop", "max_retries": 0}])
        with pool.acker.refill_lock:
            (claimed,) = live_deck.store.claim(pool.worker_id, live_deck.clock(), limit=1, types=["demo.noop"])
            pool.holdings.claimed([claimed])
        assert claimed.id == failing
        pool.acker.put(Outcome(failing, pool.worker_id, attempt=1, started_at=live_deck.clock(), error="boom"))
        wait_for(
            lambda: all(live_deck.store.get(i).status is State.COMPLETED for i in ids),
            timeout=15,
            message="the held jobs ran after a batch of failures alone",
        )
        assert live_deck.store.get(failing).status is State.DEAD
    finally:
        pool.stop(grace=5)


def test_an_unhealthy_pool_gives_back_held_jobs_with_its_queued_ones(live_deck: Jobdeck) -> None:
    pool = pool_for(live_deck, 2, queues=[ELSEWHERE])
    pool.start()
    try:
        ids = _hold(pool, live_deck, 2)
        pool.monitor.give_back_prefetched()  # what the monitor does while the pool is unhealthy
        assert [live_deck.store.get(i).status for i in ids] == [State.PENDING, State.PENDING]
        assert pool.acker.held == [] and pool.inflight == 0
    finally:
        pool.stop(grace=5)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the refill and its lock wait are SQLite's
def test_held_jobs_start_while_another_process_holds_the_write_lock(live_deck: Jobdeck, registry, backend) -> None:  # type: ignore[no-untyped-def]
    """The next refill finds the write lock taken (another process is
    writing, and this one's fetcher or monitor queues behind it): the held
    jobs go to the executors before it waits, not after the other
    process's transaction."""
    started = threading.Event()
    registry.handler("t.started")(lambda payload, ctx: started.set())
    pool = pool_for(live_deck, 2, queues=[ELSEWHERE])
    pool.start()
    other = sqlite3.connect(str(live_deck.store.engine.url.database), isolation_level=None)
    try:
        (held_id,) = live_deck.enqueue_many([{"type": "t.started"}])
        (done_id,) = live_deck.enqueue_many([{"type": "demo.noop"}])
        with pool.acker.refill_lock:
            claimed = live_deck.store.claim(pool.worker_id, live_deck.clock(), limit=2)
            pool.holdings.claimed(claimed)
            pool.acker.held = [j for j in claimed if j.id == held_id]
        assert sorted(j.id for j in claimed) == sorted([held_id, done_id])
        other.execute("BEGIN IMMEDIATE")  # another process's transaction, held open
        pool.acker.put(Outcome(done_id, pool.worker_id, attempt=1, started_at=live_deck.clock()))
        ok = started.wait(10)
        assert ok, "the held job waited for another process's transaction"
    finally:
        other.execute("ROLLBACK") if other.in_transaction else None
        other.close()
        pool.stop(grace=5)
    wait_for(lambda: live_deck.store.get(done_id).status is State.COMPLETED, timeout=15)


def _fast_and_slow(make_deck, registry, monkeypatch, release: threading.Event):  # type: ignore[no-untyped-def]
    """A deck with a concurrency limit per key, a job of key a that ends at
    once and one of key b that ends on ``release``, and a pool on it whose
    acker may wait 30 s (as if its last cycle had taken that long)."""
    registry.handler("t.keyed")(lambda payload, ctx: payload["slow"] and release.wait(30))
    deck = make_deck(types={"t.keyed": {"concurrency": 1, "concurrency_key": "payload.k"}})
    fast, slow = deck.enqueue_many([{"type": "t.keyed", "payload": {"k": k, "slow": k == "b"}} for k in "ab"])
    monkeypatch.setattr(acks, "GATHER_MAX", 30.0)
    pool = pool_for(deck, 2)
    pool.acker._cycle = 30.0
    return deck, pool, fast, slow


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # SQLite's acker refills without waiting
def test_a_limited_cycle_on_postgres_waits_for_the_jobs_still_running(
    make_deck, registry, backend, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Under a concurrency limit the acker's cycle claims each key's next
    job: begun at the first outcome, it left the others' keys to a cycle of
    their own, and the keys kept out of step. It waits (within its bound)
    until every held job has its outcome: two jobs claimed together, one
    done at once and one let go only once the first reached the acker,
    complete in one transaction."""
    release = threading.Event()
    deck, pool, fast, slow = _fast_and_slow(make_deck, registry, monkeypatch, release)
    pool.start()
    try:
        wait_for(
            lambda: (
                any(o.job_id == fast for o in pool.acker._gathered) or deck.store.get(fast).status is State.COMPLETED
            ),
            timeout=15,
            message="the fast job's outcome reached the acker",
        )
        assert deck.store.get(fast).status is State.RUNNING, "completed alone, before the slow job ended"
        release.set()
        wait_for(lambda: all_in(deck, (fast, slow), [State.COMPLETED]), timeout=15)
    finally:
        release.set()
        pool.stop(grace=5)
    (a,), (b,) = deck.store.attempts_of(fast), deck.store.attempts_of(slow)
    assert a.finished_at == b.finished_at, "one cycle completed both"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_cycle_does_not_wait_once_a_refill_filled_its_room(make_deck, registry, backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A refill that claimed most of its room was held back by no limit (a
    limit on another type, say): the pool holds more jobs than end within
    the wait, and each cycle would wait it out. The fast job completes while
    the slow one still runs."""
    release = threading.Event()
    deck, pool, fast, slow = _fast_and_slow(make_deck, registry, monkeypatch, release)
    pool.acker._held_back = False  # what a refill that filled its room leaves
    pool.start()
    try:
        wait_for(lambda: deck.store.get(fast).status is State.COMPLETED, timeout=15, message="the fast job completed")
        assert deck.store.get(slow).status is State.RUNNING
        release.set()
        wait_for(lambda: deck.store.get(slow).status is State.COMPLETED, timeout=15)
    finally:
        release.set()
        pool.stop(grace=5)
