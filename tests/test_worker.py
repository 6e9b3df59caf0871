"""The embedded pool with real threads on a real SQLite file."""

from __future__ import annotations

import threading

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.store.models import demo_charges, demo_outbox
from jobdeck.worker.pool import WorkerPool
from sqlalchemy import func, select

from tests.conftest import all_in, wait_for

pytestmark = pytest.mark.backends


def _status(deck: Jobdeck, job_id: int) -> State:
    return deck.store.get(job_id).status


def _pool(deck: Jobdeck, threads: int = 2, **kw) -> WorkerPool:
    pool = pool_for(deck, threads, **kw)
    pool.start()
    return pool


def test_pool_runs_jobs_retries_and_dead_letters(live_deck: Jobdeck) -> None:
    live_deck.config.backoff_base = 0.05
    ok, _ = live_deck.enqueue("demo.send-email", {"user_id": "u1"})
    flaky, _ = live_deck.enqueue("demo.flaky", {"failures": 2}, max_retries=3)
    doomed, _ = live_deck.enqueue("demo.fail", {"message": "nope"}, max_retries=1)
    pool = _pool(live_deck)
    try:
        wait_for(lambda: _status(live_deck, ok.id) is State.COMPLETED, message="send-email completes")
        wait_for(lambda: _status(live_deck, flaky.id) is State.COMPLETED, message="flaky completes")
        wait_for(lambda: _status(live_deck, doomed.id) is State.DEAD, message="fail lands in dead")
    finally:
        pool.stop(grace=5)
    assert [a.outcome for a in live_deck.store.attempts_of(flaky.id)] == ["failed", "failed", "completed"]
    dead = live_deck.store.attempts_of(doomed.id)
    assert [a.outcome for a in dead] == ["failed", "failed"]
    assert all(a.traceback and "RuntimeError: nope" in a.traceback for a in dead)
    with live_deck.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(demo_outbox)).scalar() == 1


def test_enqueue_wakes_the_pool_without_waiting_for_a_poll(live_deck: Jobdeck) -> None:
    pool = _pool(live_deck, poll_interval=60)
    try:
        wait_for(lambda: pool.inflight == 0)
        job, _ = live_deck.enqueue("demo.noop")
        wait_for(lambda: _status(live_deck, job.id) is State.COMPLETED, timeout=5, message="woken claim")
    finally:
        pool.stop(grace=1)


def test_pool_claims_only_types_it_handles(make_deck, registry: Registry) -> None:
    deck = make_deck(external_types=["pdf.render"])
    external, _ = deck.enqueue("pdf.render")
    mine, _ = deck.enqueue("demo.noop")
    pool = _pool(deck)
    try:
        wait_for(lambda: _status(deck, mine.id) is State.COMPLETED)
        pool.fetch_once()
        assert _status(deck, external.id) is State.PENDING
    finally:
        pool.stop(grace=1)


def test_timeout_fails_the_attempt_and_refuses_the_late_result(make_deck, registry: Registry) -> None:
    release = threading.Event()
    entered = threading.Event()

    @registry.handler("test.hang", timeout=0.3, max_retries=0)
    def hang(payload: dict, ctx: JobContext) -> str:
        entered.set()
        release.wait(30)
        return "late"

    deck = make_deck()
    job, _ = deck.enqueue("test.hang")
    other, _ = deck.enqueue("demo.noop")
    pool = _pool(deck, threads=1)
    try:
        wait_for(entered.is_set)
        wait_for(lambda: _status(deck, job.id) is State.DEAD, message="timed out job is dead")
        # The hung thread's place was given to a new one: other work goes on.
        wait_for(lambda: _status(deck, other.id) is State.COMPLETED, message="replacement thread")
        release.set()
        wait_for(lambda: job.id not in pool.running_jobs())
    finally:
        pool.stop(grace=2)
    (attempt,) = deck.store.attempts_of(job.id)
    assert attempt.outcome == "timed_out" and attempt.error == "timed out after 0.3 s"
    final = deck.store.get(job.id)
    assert final.status is State.DEAD and final.result is None


def test_graceful_shutdown_waits_then_releases(make_deck, registry: Registry) -> None:
    gate = threading.Event()
    started = threading.Semaphore(0)

    @registry.handler("test.block", max_retries=0)
    def block(payload: dict, ctx: JobContext) -> None:
        started.release()
        if payload.get("quick"):
            return
        gate.wait(30)

    deck = make_deck()
    quick, _ = deck.enqueue("test.block", {"quick": True}, priority=30)
    stuck = [deck.enqueue("test.block", {"n": i}, priority=20)[0] for i in range(2)]
    waiting = [deck.enqueue("test.block", {"w": i})[0] for i in range(5)]
    pool = _pool(deck, threads=2)
    try:
        # Both stuck handlers started (a claimed job is ``running`` before its
        # handler starts): the quick one's start and theirs.
        assert all(started.acquire(timeout=30) for _ in range(3)), "the quick and both stuck handlers started"
        wait_for(lambda: all(_status(deck, j.id) is State.RUNNING for j in stuck), message="both stuck running")
        wait_for(lambda: _status(deck, quick.id) is State.COMPLETED, message="the quick one acknowledged")
        pool.stop(grace=0.3)
    finally:
        gate.set()
    for job in stuck + waiting:
        after = deck.store.get(job.id)
        assert after.status is State.PENDING, (job.id, after.status)
        assert after.retry_count == 0 and after.worker_id is None
    # The started ones are recorded as cut short; the others never ran. Both keep their attempt number.
    for job in stuck:
        assert deck.store.get(job.id).attempt == 1
        assert [a.outcome for a in deck.store.attempts_of(job.id)] == ["interrupted"]
    assert all(deck.store.attempts_of(j.id) == [] for j in waiting)
    # Nothing was lost: another pool picks everything up.
    gate.set()
    again = _pool(deck, threads=2)
    try:
        wait_for(lambda: all(_status(deck, j.id) is State.COMPLETED for j in stuck + waiting), message="rerun")
    finally:
        again.stop(grace=2)


def test_charge_card_redelivered_charges_once(live_deck: Jobdeck) -> None:
    live_deck.config.backoff_base = 0.05
    # Attempt 1 charges and then fails; attempt 2 must not charge again.
    job, _ = live_deck.enqueue("demo.charge-card", {"order_id": "o-99", "amount_cents": 500, "fail_after_charge": True})
    # A second delivery of the same order as another job (a duplicate message).
    dup, _ = live_deck.enqueue("demo.charge-card", {"order_id": "o-99", "amount_cents": 500})
    pool = _pool(live_deck)
    try:
        wait_for(lambda: all(_status(live_deck, j.id) is State.COMPLETED for j in (job, dup)))
    finally:
        pool.stop(grace=2)
    assert [a.outcome for a in live_deck.store.attempts_of(job.id)] == ["failed", "completed"]
    with live_deck.store.read() as conn:
        rows = conn.execute(select(demo_charges.c.order_id, demo_charges.c.amount_cents)).all()
    assert [tuple(r) for r in rows] == [("o-99", 500)]


def test_progress_is_stored_while_running(make_deck, registry: Registry) -> None:
    gate = threading.Event()

    @registry.handler("test.progress")
    def progress(payload: dict, ctx: JobContext) -> None:
        ctx.progress(0.4, "rendered 400 of 1000 rows")
        gate.wait(30)

    deck = make_deck()
    job, _ = deck.enqueue("test.progress")
    pool = _pool(deck, threads=1)
    try:
        wait_for(lambda: deck.store.get(job.id).progress == 0.4)
        assert deck.store.get(job.id).progress_message == "rendered 400 of 1000 rows"
        gate.set()
        wait_for(lambda: _status(deck, job.id) is State.COMPLETED)
    finally:
        gate.set()
        pool.stop(grace=2)
    assert deck.store.get(job.id).progress == 1.0


def test_heartbeat_keeps_held_jobs_alive(make_deck, registry: Registry) -> None:
    gate = threading.Event()

    @registry.handler("test.wait")
    def wait(payload: dict, ctx: JobContext) -> None:
        gate.wait(30)

    deck = make_deck(heartbeat_interval=0.1, stall_timeout=1.0)
    job, _ = deck.enqueue("test.wait")
    pool = _pool(deck, threads=1)
    try:
        wait_for(lambda: _status(deck, job.id) is State.RUNNING)
        first = deck.store.get(job.id).heartbeat_at
        wait_for(lambda: deck.store.get(job.id).heartbeat_at > first, message="heartbeat advances")
        workers = deck.store.list_workers()
        assert workers[0]["id"] == pool.worker_id and workers[0]["running"] == 1
    finally:
        gate.set()
        pool.stop(grace=2)


def test_prefetched_jobs_are_shed_when_slow_jobs_hold_every_thread(make_deck, registry: Registry) -> None:
    gate = threading.Event()

    @registry.handler("test.slow", max_retries=0)
    def slow(payload: dict, ctx: JobContext) -> None:
        gate.wait(30)

    deck = make_deck()
    pool = _pool(deck, threads=1)
    other = pool_for(make_deck(), 1)
    try:
        # Many fast jobs teach the pool to prefetch deeply...
        deck.enqueue_many([{"type": "demo.noop"} for _ in range(300)])
        wait_for(lambda: deck.store.counts(deck.clock())["completed"] == 300, message="fast jobs done")
        # ...then a burst of slow ones arrives: one runs, the rest must not wait behind it.
        slow_ids = deck.enqueue_many([{"type": "test.slow"} for _ in range(6)])
        wait_for(lambda: len(pool.running_jobs()) == 1, message="a slow job runs")
        # A claim the fetcher began before the pool learnt its jobs are slow
        # may take the shed jobs back once; the monitor sheds them again, so
        # what must hold is where it settles: the pool holds its one running
        # job, in memory and in the rows, and the rest wait unclaimed.
        rows: list[tuple[int, str, str | None, int]] = []

        def settled() -> bool:
            held = [deck.store.get(i) for i in slow_ids]
            rows[:] = [(j.id, j.status.value, j.worker_id, j.attempt) for j in held]
            return pool.inflight == 1 and sum(j.status is State.RUNNING for j in held) == 1

        try:
            wait_for(settled, message="prefetched slow jobs shed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; pool {pool.worker_id} holds {pool.inflight}; the rows: {rows}") from None
        held = [deck.store.get(i) for i in slow_ids]
        assert all(j.retry_count == 0 and j.worker_id is None for j in held if j.status is State.PENDING)
        other.start()
        wait_for(lambda: len(other.running_jobs()) == 1, message="another pool takes a shed job")
        gate.set()
        wait_for(lambda: all_in(deck, slow_ids, [State.COMPLETED]), message="all done")
    finally:
        gate.set()
        pool.stop(grace=5)
        other.stop(grace=5)


def test_prefetch_is_two_batches_on_sqlite_and_four_on_postgres_within_50_ms_of_work(make_deck) -> None:
    """Tiny jobs: SQLite's acker claims in its own commit, so two batches
    keep it busy; PostgreSQL's fetcher claims on its own connection while
    the acker completes, and with two it waited for each completion to free
    room. Slower jobs: the prefetch stays what starts within about 50 ms."""
    deck = make_deck()
    pool = pool_for(deck, 4, batch=10)
    assert pool.holdings.capacity() == 4  # nothing ran yet: no prefetch
    pool.holdings.avg_duration = 1e-5
    assert pool.holdings.capacity() == 4 + (2 if deck.store.sqlite else 4) * 10
    pool.holdings.avg_duration = 0.01  # 4 threads x 50 ms / 10 ms
    assert pool.holdings.capacity() == 4 + 20


def test_pool_survives_an_unexpected_error_in_its_loops(make_deck, registry: Registry) -> None:
    """A bug in a claim (here a claim policy that raises once) is logged and the
    pool keeps working instead of losing its fetcher or acker thread."""
    deck = make_deck()
    calls = {"n": 0}
    original = deck.store.claim_policy

    def flaky_policy(store, worker_id, now, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("policy bug")
        if original is not None:
            return original(store, worker_id, now, **kw)
        return store.claim(worker_id, now, controlled=False, **kw)

    deck.store.claim_policy = flaky_policy
    job, _ = deck.enqueue("demo.noop")
    pool = _pool(deck, threads=1)
    try:
        wait_for(lambda: _status(deck, job.id) is State.COMPLETED, message="claimed after the bug")
    finally:
        pool.stop(grace=2)
    assert calls["n"] >= 2


def test_a_claim_given_back_unstarted_keeps_its_number_and_ctx_retries_counts_runs(live_deck: Jobdeck) -> None:
    """A pool that sheds a job it prefetched (or stops before starting it)
    gives it back with its attempt number kept, for the fence: its first
    run is then attempt 2. ``ctx.retries`` still says it is the first run,
    so demo.flaky fails its planned first run and succeeds on the second."""
    live_deck.config.backoff_base = 0.05
    job, _ = live_deck.enqueue("demo.flaky", {"failures": 1}, max_retries=2)
    [claimed] = live_deck.store.claim("elsewhere", live_deck.clock(), limit=1)
    assert live_deck.store.release("elsewhere", [(claimed.id, claimed.attempt)], live_deck.clock()) == [job.id]
    pool = _pool(live_deck)
    try:
        wait_for(lambda: _status(live_deck, job.id) is State.COMPLETED, message="the flaky job completed")
    finally:
        pool.stop(grace=2)
    runs = live_deck.store.attempts_of(job.id)
    assert [(a.attempt, a.outcome) for a in runs] == [(2, "failed"), (3, "completed")]
    assert "flaky: attempt 1 of 1 planned failures" in (runs[0].error or "")


def test_ctx_retries_counts_the_runs_that_failed_not_the_claims(live_deck: Jobdeck, registry: Registry) -> None:
    seen: list[tuple[int, int]] = []

    @registry.handler("test.twice", max_retries=1)
    def twice(payload: dict, ctx: JobContext) -> None:
        seen.append((ctx.attempt, ctx.retries))
        if ctx.retries == 0:
            raise RuntimeError("the first run fails")

    live_deck.config.backoff_base = 0.05
    job, _ = live_deck.enqueue("test.twice")
    [claimed] = live_deck.store.claim("elsewhere", live_deck.clock(), limit=1)
    live_deck.store.release("elsewhere", [(claimed.id, claimed.attempt)], live_deck.clock())
    pool = _pool(live_deck)
    try:
        wait_for(lambda: _status(live_deck, job.id) is State.COMPLETED, message="the job completed on its second run")
    finally:
        pool.stop(grace=2)
    assert seen == [(2, 0), (3, 1)]
