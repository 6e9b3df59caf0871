"""An async handler that blocks the pool's event loop (a ``time.sleep`` of
3 s, the mistake of a synchronous client in async code) stops every async
job of the pool while it holds it: the watchdog reports it, naming the job,
and the other async jobs, waiting meanwhile, resume and complete after it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.context import JobContext
from jobdeck.runtime import pool_for

from tests.conftest import all_in, wait_for

pytestmark = pytest.mark.backends


def test_a_loop_blocked_for_3_s_is_reported_and_the_other_async_jobs_resume(
    live_deck: Jobdeck, registry, caplog
) -> None:
    ticks: dict[int, list[float]] = {}
    blocked: list[float] = []

    @registry.handler("async.ticks")
    async def tick(payload: dict, ctx: JobContext) -> int:
        ticks[ctx.job_id] = []
        for _ in range(40):  # about 2 s of awaits, across the blocked stretch
            await asyncio.sleep(0.05)
            ticks[ctx.job_id].append(time.monotonic())
        return len(ticks[ctx.job_id])

    @registry.handler("async.blocks")
    async def blocks(payload: dict, ctx: JobContext) -> str:
        blocked.append(time.monotonic())
        time.sleep(3)
        blocked.append(time.monotonic())
        return "blocked"

    others = live_deck.enqueue_many([{"type": "async.ticks"} for _ in range(20)])
    pool = pool_for(live_deck, 2)
    pool.start()
    try:
        wait_for(lambda: len(ticks) == 20, message="the others are awaiting")
        bad = live_deck.enqueue("async.blocks").job
        with caplog.at_level(logging.WARNING, logger="jobdeck.worker"):
            wait_for(lambda: any(h.job_id == bad.id for h in pool.executors.loop.held), timeout=5, message="reported")
            wait_for(lambda: live_deck.store.get(bad.id).status is State.COMPLETED, message="the blocker ends")
            done = {State.COMPLETED}
            wait_for(lambda: all_in(live_deck, others, done), message="others resume")
            wait_for(lambda: "runs again" in caplog.text, message="the end of the hold is logged")
    finally:
        pool.stop(2.0)
    (held,) = [h for h in pool.executors.loop.held if h.job_id == bad.id]  # a loaded machine may add others
    assert held.job_type == "async.blocks" and held.seconds >= 2.5
    assert all(live_deck.store.get(i).result == 40 for i in others)
    start, end = blocked
    inside = [t for times in ticks.values() for t in times if start < t < end]
    assert not inside, "every other async job of the pool waited while the loop was held"
    assert any(t > end for times in ticks.values() for t in times), "and they went on after it"
    assert "held for 1." in caplog.text and f"by job {bad.id} (async.blocks)" in caplog.text
