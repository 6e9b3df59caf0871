"""``async def`` handlers run, on both databases: before, the pool called
one, got its coroutine back unawaited, and reported the job completed in
2 ms with "<coroutine object ...>" as its result; the body never ran."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext
from jobdeck.runtime import pool_for
from jobdeck.store.joblogs import lines_of
from jobdeck.store.records import JobRecord
from jobdeck.worker import async_loop

from tests.conftest import all_in, wait_for

pytestmark = pytest.mark.backends


def test_an_async_handler_runs_to_its_end_and_its_errors_fail_the_attempt(live_deck: Jobdeck, registry) -> None:
    ran: list[int] = []

    @registry.handler("async.fetch", max_retries=0)
    async def fetch(payload: dict, ctx: JobContext) -> dict:
        await asyncio.sleep(0.05)
        if payload.get("fail"):
            raise ConnectionError("upstream closed the connection")
        ran.append(ctx.job_id)
        return {"fetched": payload["url"]}

    ok = live_deck.enqueue("async.fetch", {"url": "https://example.test/a"}).job
    bad = live_deck.enqueue("async.fetch", {"url": "https://example.test/b", "fail": True}).job
    pool = pool_for(live_deck, 2)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.get(ok.id).status is State.COMPLETED, message="the async job completes")
        wait_for(lambda: live_deck.store.get(bad.id).status is State.DEAD, message="the failing one is dead")
    finally:
        pool.stop(2.0)
    assert ran == [ok.id], "the body ran, once"
    assert live_deck.store.get(ok.id).result == {"fetched": "https://example.test/a"}
    assert "ConnectionError: upstream closed the connection" in (live_deck.store.get(bad.id).error or "")
    assert [a.executor for i in (ok.id, bad.id) for a in live_deck.store.attempts_of(i)] == ["async", "async"]


def _async_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("jobdeck-async")]


def test_many_async_jobs_wait_at_once_without_holding_the_threads(live_deck: Jobdeck, registry) -> None:
    """200 jobs that each await: with 4 threads and the default
    ``async_concurrency`` (100), 100 are in flight at once (a thread each
    would run 4 at a time), on one loop, then all complete."""
    release = asyncio.Event()
    running: list[int] = []
    most = [0]
    loops: set[int] = set()

    @registry.handler("async.nap")
    async def nap(payload: dict, ctx: JobContext) -> int:
        loops.add(id(asyncio.get_running_loop()))
        running.append(ctx.job_id)
        most[0] = max(most[0], len(running))
        if len(running) == 100:
            release.set()
        await asyncio.wait_for(release.wait(), 30)
        await asyncio.sleep(0.01)
        running.remove(ctx.job_id)
        return payload["n"]

    ids = live_deck.enqueue_many([{"type": "async.nap", "payload": {"n": n}} for n in range(200)])
    pool = pool_for(live_deck, 4)
    pool.start()
    try:
        done = {State.COMPLETED}
        wait_for(lambda: all_in(live_deck, ids, done), timeout=30, message="all complete")
    finally:
        pool.stop(2.0)
    assert most[0] == 100, "as many in flight as async_concurrency, no more"
    assert len(loops) == 1, "one loop for every job, not one each"
    assert pool.holdings.avg_duration is None, "async jobs' waits do not size the threads' prefetch"
    assert live_deck.store.get(ids[7]).result == 7


def test_async_concurrency_bounds_the_jobs_in_flight(make_deck, registry) -> None:
    running: list[int] = []
    most = [0]
    go = threading.Event()

    @registry.handler("async.bounded")
    async def bounded(payload: dict, ctx: JobContext) -> None:
        running.append(ctx.job_id)
        most[0] = max(most[0], len(running))
        while not go.is_set():
            await asyncio.sleep(0.01)
        running.remove(ctx.job_id)

    deck = make_deck(async_concurrency=5)
    ids = deck.enqueue_many([{"type": "async.bounded"} for _ in range(12)])
    pool = pool_for(deck, 2)
    pool.start()
    try:
        wait_for(lambda: len(running) == 5, message="five start")
        assert pool.holdings.async_inflight == 5
        go.set()
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED]), message="all complete")
    finally:
        pool.stop(2.0)
    assert most[0] == 5


def test_sync_and_async_handlers_share_a_pool_and_a_sync_one_keeps_its_thread(live_deck: Jobdeck, registry) -> None:
    """An async job waiting does not hold the one thread: a sync job runs meanwhile."""
    go = threading.Event()

    @registry.handler("async.waits")
    async def waits(payload: dict, ctx: JobContext) -> str:
        while not go.is_set():
            await asyncio.sleep(0.01)
        return "async"

    @registry.handler("sync.quick")
    def quick(payload: dict, ctx: JobContext) -> str:
        return "sync"

    a = live_deck.enqueue("async.waits").job
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: a.id in pool.running_jobs(), message="the async job runs")
        s = live_deck.enqueue("sync.quick").job
        wait_for(lambda: live_deck.store.get(s.id).status is State.COMPLETED, message="the sync one runs meanwhile")
        assert live_deck.store.get(a.id).status is State.RUNNING
        go.set()
        wait_for(lambda: live_deck.store.get(a.id).status is State.COMPLETED, message="the async one completes")
    finally:
        pool.stop(2.0)
    assert live_deck.store.get(a.id).result == "async" and live_deck.store.get(s.id).result == "sync"


def test_a_pool_without_async_handlers_starts_no_loop(live_deck: Jobdeck, registry) -> None:
    @registry.handler("sync.only")
    def only(payload: dict, ctx: JobContext) -> str:
        return "ok"

    job = live_deck.enqueue("sync.only").job
    before = _async_threads()
    pool = pool_for(live_deck, 2)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.get(job.id).status is State.COMPLETED, message="completes")
        assert pool.executors.loop is None and _async_threads() == before
    finally:
        pool.stop(2.0)


def _run_until_completed(deck: Jobdeck, job_id: int, message: str) -> None:
    """A one-thread pool runs until job ``job_id`` is completed, then stops."""
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job_id).status is State.COMPLETED, message=message)
    finally:
        pool.stop(2.0)


@contextmanager
def _cancelled_once_running(
    deck: Jobdeck, job_type: str, grace: float = 2.0, entered: threading.Event | None = None
) -> Iterator[tuple[JobRecord, Any]]:
    """A one-thread pool runs a job of ``job_type``, which is cancelled once
    it runs (once its handler set ``entered``, if given) and ends
    ``cancelled``; the pool stops (within ``grace``) after the caller's block."""
    job = deck.enqueue(job_type).job
    pool = pool_for(deck, 1, heartbeat_interval=60)
    pool.start()
    try:
        wait_for(lambda: job.id in pool.running_jobs(), message="started")
        if entered is not None:
            wait_for(entered.is_set, message="the handler's body runs")
        deck.cancel(job.id, actor="tester")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=5, message="ends cancelled")
        yield job, pool
    finally:
        pool.stop(grace)


def test_a_cancel_interrupts_the_coroutine_and_its_finally_runs(live_deck: Jobdeck, registry) -> None:
    cleaned: list[str] = []
    # A job the pool runs is not yet a coroutine in its try: a cancel that came
    # first (seen once on a quiet machine) ends the job before the body starts,
    # and there is no finally to run. So the cancel waits for the body.
    entered = threading.Event()

    @registry.handler("async.long", max_retries=5)
    async def long(payload: dict, ctx: JobContext) -> None:
        try:
            entered.set()
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.01)  # a finally may await, within its grace
            cleaned.append("finally")

    with _cancelled_once_running(live_deck, "async.long", entered=entered) as (job, _):
        # Within the loop's grace for a finally (5 s), however starved this process is.
        wait_for(lambda: cleaned == ["finally"], timeout=10, message="the cancelled coroutine's finally ran")
    final = live_deck.store.get(job.id)
    assert final.attempt == 1 and final.retry_count == 0
    (row,) = live_deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.CANCELLED and "Cancelled" in (row.error or "")


def test_a_timeout_fails_the_attempt_and_cancels_the_task(live_deck: Jobdeck, registry) -> None:
    cancelled: list[bool] = []

    @registry.handler("async.hang", timeout=0.3, max_retries=0)
    async def hang(payload: dict, ctx: JobContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    job = live_deck.enqueue("async.hang").job
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.get(job.id).status is State.DEAD, timeout=5, message="timed out")
        wait_for(lambda: cancelled, message="the coroutine was cancelled")
        assert pool.monitor.abandoned_threads() == 0, "no thread was given up on"
    finally:
        pool.stop(2.0)
    assert "timed out after 0.3 s" in (live_deck.store.get(job.id).error or "")


def test_an_async_effect_is_performed_once_across_attempts(live_deck: Jobdeck, registry) -> None:
    performed: list[str] = []

    async def charge(key: str) -> dict:
        await asyncio.sleep(0)
        performed.append(key)
        return {"charged": key}

    @registry.handler("async.charge", max_retries=1, backoff_base=0.01)
    async def pay(payload: dict, ctx: JobContext) -> dict:
        receipt = await ctx.aeffect(f"charge:{payload['order']}", lambda: charge(f"o{payload['order']}"))
        ctx.log("charged %s", receipt)
        ctx.progress(0.5, "charged")
        if ctx.retries == 0:
            raise ConnectionError("after the charge")
        return receipt

    # The effect's outcome is the point, not the lease: on a starved machine
    # (CI's quick tiers run at the lowest priority) a heartbeat 2.5 s late
    # lost the lease at the default 5 s, the handler was told to stop inside
    # its effect, and the job went dead with the outcome unknown, as it must.
    live_deck.config.stall_timeout = 120.0
    job = live_deck.enqueue("async.charge", {"order": 7}).job
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.get(job.id).status is State.COMPLETED, timeout=10, message="completes")
    finally:
        pool.stop(2.0)
    assert performed == ["o7"], "once, though two attempts reached it"
    assert live_deck.store.get(job.id).result == {"charged": "o7"}


def test_a_blocking_call_is_reported_and_the_others_resume(live_deck: Jobdeck, registry, caplog) -> None:
    @registry.handler("async.blocks")
    async def blocks(payload: dict, ctx: JobContext) -> None:
        time.sleep(1.5)  # the mistake the watchdog is for

    @registry.handler("async.fine")
    async def fine(payload: dict, ctx: JobContext) -> str:
        await asyncio.sleep(0.01)
        return "ok"

    bad = live_deck.enqueue("async.blocks").job
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        loop = wait_for(lambda: pool.executors.loop, message="the loop started")
        wait_for(lambda: any(h.job_id == bad.id for h in loop.held), timeout=5, message="reported")
        ok = live_deck.enqueue("async.fine").job
        wait_for(lambda: live_deck.store.get(ok.id).status is State.COMPLETED, timeout=5, message="others resume")
        wait_for(lambda: live_deck.store.get(bad.id).status is State.COMPLETED, message="the blocker ends")
        wait_for(lambda: "runs again" in caplog.text, message="the end of the hold is logged and kept")
    finally:
        pool.stop(2.0)
    (held,) = [h for h in pool.executors.loop.held if h.job_id == bad.id]  # a loaded machine may add others
    assert held.job_type == "async.blocks" and held.seconds >= 1.0
    assert any("is held for" in r.getMessage() and str(bad.id) in r.getMessage() for r in caplog.records)
    (row,) = [w for w in live_deck.store.list_workers() if w["id"] == pool.worker_id]
    if pool.executors.loop.held[-1] == held:  # the last hold is the row's (a loaded machine may add others)
        assert (row["loop_held_job"], row["loop_held_type"]) == (bad.id, "async.blocks")
        assert row["loop_held_seconds"] == held.seconds and row["loop_held_at"] is not None


def test_the_workers_page_shows_the_last_held_loop(deck: Jobdeck, dash) -> None:
    from jobdeck.store.timekeeping import record_loop_held

    deck.store.register_worker("host-a:1:abc", "host-a", 1, 4, deck.clock())
    record_loop_held(deck.store, "host-a:1:abc", 3.2, 42, "pages.fetch", deck.clock())
    page = dash.get("/workers").get_data(as_text=True)
    assert "Async loop held" in page and "3.2 s</span> by job" in page and "pages.fetch" in page


def test_a_stop_cancels_a_running_async_job_and_releases_it(live_deck: Jobdeck, registry) -> None:
    cleaned: list[str] = []

    @registry.handler("async.forever")
    async def forever(payload: dict, ctx: JobContext) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append("finally")

    job = live_deck.enqueue("async.forever").job
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: job.id in pool.running_jobs(), message="started")
    finally:
        pool.stop(0.2)
    assert cleaned == ["finally"]
    assert not pool.executors.loop.thread.is_alive(), "the loop ended with the pool"
    released = live_deck.store.get(job.id)
    assert released.status is State.PENDING and released.retry_count == 0


def test_a_type_concurrency_limit_holds_for_async_jobs(make_deck, registry) -> None:
    running: list[int] = []
    most = [0]

    @registry.handler("async.limited")
    async def limited(payload: dict, ctx: JobContext) -> None:
        running.append(ctx.job_id)
        most[0] = max(most[0], len(running))
        await asyncio.sleep(0.05)
        running.remove(ctx.job_id)

    deck = make_deck(types={"async.limited": {"concurrency": 2}})
    ids = deck.enqueue_many([{"type": "async.limited"} for _ in range(10)])
    pool = pool_for(deck, 4)
    pool.start()
    try:
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED]), message="all complete")
    finally:
        pool.stop(2.0)
    assert most[0] == 2


def test_a_handler_that_ignores_its_cancel_is_given_up_on_after_the_grace(
    live_deck: Jobdeck, registry, monkeypatch
) -> None:
    monkeypatch.setattr(async_loop, "FINALLY_GRACE", 0.3)
    stubborn = asyncio.Event()
    entered = threading.Event()

    @registry.handler("async.stubborn")
    async def stubborn_handler(payload: dict, ctx: JobContext) -> str:
        # Cancelled before its first step, a coroutine never reaches the
        # except that ignores it (it ends plainly cancelled): seen once in a
        # full run, where the loop had not stepped the new task yet.
        entered.set()
        while not stubborn.is_set():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue  # swallows every cancel
        return "late"

    with _cancelled_once_running(live_deck, "async.stubborn", grace=1.0, entered=entered) as (job, pool):
        try:
            assert "ignored the cancel" in (live_deck.store.get(job.id).error or "")
        finally:
            pool.executors.loop.loop.call_soon_threadsafe(stubborn.set)
    assert live_deck.store.get(job.id).result is None, "its late result was refused"


def test_the_context_from_the_loop_progress_and_captured_logs(make_deck, registry) -> None:
    applog = logging.getLogger("tests.async.app")
    applog.setLevel(logging.INFO)
    go = asyncio.Event()

    @registry.handler("async.reports")
    async def reports(payload: dict, ctx: JobContext) -> None:
        ctx.progress(0.2, "first")
        ctx.progress(0.4, "second")  # the latest wins
        applog.info("job %s by logging", payload["n"])
        ctx.log("job %s by ctx", payload["n"])
        await asyncio.wait_for(go.wait(), 30)

    # A lease of 30 s (half of stall_timeout): starved at a low priority beside the
    # full run (CI's quick tier on Python 3.13), the pool's beats missed the tests'
    # 2.5 s lease, the handlers were told "lease lost" and job 0 ran a second attempt,
    # whose lines this test then read too. What it checks is the context and the logs.
    deck = make_deck(stall_timeout=60.0, logs={"capture_logging": True, "flush_interval": 0.05})
    jobs = [deck.enqueue("async.reports", {"n": n}).job for n in range(3)]
    pool = pool_for(deck, 1)
    pool.start()
    try:
        for job in jobs:
            wait_for(lambda job=job: deck.store.get(job.id).progress == 0.4, message="the latest progress is stored")
            assert deck.store.get(job.id).progress_message == "second"
        pool.executors.loop.loop.call_soon_threadsafe(go.set)
        wait_for(lambda: all_in(deck, [j.id for j in jobs], [State.COMPLETED]), message="complete")
    finally:
        pool.stop(2.0)
    for n, job in enumerate(jobs):
        lines = [line.message for line in lines_of(deck.store, job.id)]
        assert lines == [f"job {n} by logging", f"job {n} by ctx"], "each task's records on its own attempt"


def test_an_async_handler_snoozes_without_a_retry_counted(live_deck: Jobdeck, registry) -> None:
    @registry.handler("async.later")
    async def later(payload: dict, ctx: JobContext) -> int:
        await asyncio.sleep(0)
        if ctx.attempt < 3:
            ctx.snooze(0.1, "not yet")
        return ctx.attempt

    job = live_deck.enqueue("async.later", max_retries=0).job
    _run_until_completed(live_deck, job.id, "snoozed twice, then done")
    done = live_deck.store.get(job.id)
    assert (done.retry_count, done.attempt, done.result) == (0, 3, 3)
    assert [a.outcome.value for a in live_deck.store.attempts_of(job.id)] == ["snoozed", "snoozed", "completed"]


def test_a_plain_function_returning_a_coroutine_has_it_run_on_the_pools_loop(live_deck: Jobdeck, registry) -> None:
    """Not only ``async def``: any handler's awaitable runs to its end, never
    stored unawaited as its repr."""
    loops: list[str] = []

    async def body(n: int) -> int:
        await asyncio.sleep(0.01)
        loops.append(threading.current_thread().name)
        return n * 2

    registry.handler("async.wrapped")(lambda payload, ctx: body(payload["n"]))
    job = live_deck.enqueue("async.wrapped", {"n": 21}).job
    _run_until_completed(live_deck, job.id, "completes")
    assert live_deck.store.get(job.id).result == 42
    assert loops == ["jobdeck-async-loop"]


def test_a_loop_held_past_the_stall_timeout_makes_the_pool_unhealthy_until_it_ends(make_deck, registry) -> None:
    """Its heartbeats go on, so no other process rescues the async jobs
    waiting behind the hold: the pool says it is unhealthy (and claims
    nothing, and ``exit_when_unhealthy`` restarts it), like past
    ``max_abandoned_threads``; healthy again once the loop runs."""
    release = threading.Event()

    @registry.handler("async.stuck")
    async def stuck(payload: dict, ctx: JobContext) -> str:
        release.wait(30)  # the blocking call
        return "ran"

    deck = make_deck(heartbeat_interval=0.2, stall_timeout=1.0)
    job = deck.enqueue("async.stuck").job
    pool = pool_for(deck, 1)
    pool.start()
    try:
        reason = wait_for(pool.unhealthy_reason, timeout=10, message="unhealthy past stall_timeout")
        assert f"held by job {job.id} (async.stuck) for more than 1 s" in reason
        assert any("held by job" in p for p in deck.health.problems()), "/api/health answers 503 with it"
        wait_for(lambda: any(w["unhealthy"] for w in deck.store.list_workers()), message="the Workers page shows it")
        release.set()
        wait_for(lambda: pool.unhealthy_reason() is None, message="healthy again once the loop runs")
        wait_for(lambda: deck.store.get(job.id).status is State.COMPLETED, message="the job completes")
    finally:
        release.set()
        pool.stop(2.0)
