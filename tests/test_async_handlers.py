"""``async def`` handlers run, on both databases: before, the pool called
one, got its coroutine back unawaited, and reported the job completed in
2 ms with "<coroutine object ...>" as its result; the body never ran."""

from __future__ import annotations

import asyncio

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext
from jobdeck.runtime import pool_for

from tests.conftest import wait_for

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
