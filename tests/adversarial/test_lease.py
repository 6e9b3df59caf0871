"""A pool that cannot heartbeat knows its lease is going (``jobdeck.worker.lease``).

The database goes away for real (PostgreSQL: every connection of the test
relayed, then dropped and refused; SQLite: another process holds the write
lock), while a handler runs. Within half of ``stall_timeout`` the handler is
told ``ctx.cancelled`` with the reason "lease lost", and the pool claims
nothing; when the database is back the pool has its lease again without a
restart, gives the stopped attempt back (recorded as interrupted, no retry
counted), and runs the job again to completion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.context import JobContext
from jobdeck.runtime import pool_for
from jobdeck.worker.lease import LEASE_LOST

from tests import skew_handlers
from tests.adversarial.outages import Outage
from tests.conftest import wait_for

pytestmark = pytest.mark.backends
STALL = 4.0


async def async_hold(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """``skew.hold`` as an ``async def`` handler: a lost lease cancels its task."""
    row = {"job": ctx.job_id, "attempt": ctx.attempt, "start": time.time()}
    skew_handlers.append(payload["log"], {**row, "event": "start"})
    try:
        await asyncio.sleep(float(payload["seconds"] if ctx.attempt == 1 else payload["later"]))
    except asyncio.CancelledError:
        skew_handlers.append(payload["log"], {**row, "event": "stopped", "reason": ctx.cancel_reason})
        raise
    skew_handlers.append(payload["log"], {**row, "event": "done"})
    return {}


@pytest.mark.parametrize("kind", ["thread", "async", "process"])
def test_a_pool_cut_off_for_half_the_stall_timeout_stops_its_handlers_and_takes_its_lease_back(
    backend, db_url, tmp_path, make_config, registry, kind
):
    skew_handlers.register(registry)
    if kind == "async":
        registry.handler(skew_handlers.HOLD)(async_hold)
    if kind == "process":  # told in its child, through the pipe: ctx.cancelled set, the reason with it
        registry.handler(skew_handlers.HOLD, executor="process")(skew_handlers.hold)
    outage = Outage(backend, db_url)
    deck = Jobdeck(
        make_config(database_url=outage.url, stall_timeout=STALL, heartbeat_interval=0.5, sqlite_busy_timeout=2.0),
        registry,
    )
    deck.init_db()
    runs = tmp_path / "runs.jsonl"
    job = deck.enqueue(skew_handlers.HOLD, {"seconds": 60, "later": 0, "log": str(runs)}).job
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: skew_handlers.read(runs), timeout=20, message="the handler started")
        cut = time.monotonic()
        outage.down()
        try:
            stopped = wait_for(
                lambda: [r for r in skew_handlers.read(runs) if r["event"] == "stopped"],
                timeout=STALL,
                message="the handler told the lease is lost, before stall_timeout",
            )
            told_after = time.monotonic() - cut
            assert stopped[0]["reason"] == LEASE_LOST
            assert pool.lease.lost
            assert pool.fetch_once() == 0, "a pool without its lease claims nothing (and does not even try)"
        finally:
            outage.up()
        wait_for(lambda: not pool.lease.lost, timeout=20, message="the lease back once a beat lands")
        done = wait_for(
            lambda: deck.store.get(job.id).status is State.COMPLETED and deck.store.get(job.id),
            timeout=30,
            message="the job given back and run again",
        )
        attempts = deck.store.attempts_of(job.id)
    finally:
        pool.stop(2.0)
        outage.close()
        deck.store.engine.dispose()
    print(f"{backend}: handler told 'lease lost' {told_after:.2f} s after the cut (stall_timeout {STALL:g} s); "
          f"attempts {[str(a.outcome) for a in attempts]}")  # fmt: skip
    assert told_after < STALL
    assert [a.outcome for a in attempts] == ["interrupted", "completed"]
    assert done.retry_count == 0, "losing the lease is not the handler's failure"


def test_a_job_claimed_under_the_pools_id_that_never_reached_it_is_given_back(live_deck, registry, tmp_path, caplog):
    """A claim whose COMMIT landed but whose reply was lost (the connection
    died on the way back) holds jobs under the pool's worker id that the pool
    never queued; its heartbeats used to keep them alive forever, never run.
    Here the same claim statement runs under the pool's id and its answer is
    dropped: two beats later the job is given back and the pool runs it."""
    skew_handlers.register(registry)
    runs = tmp_path / "runs.jsonl"
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        # Due in 2 s, claimed now from 3 s ahead: the pool's own fetcher cannot have it first.
        job = live_deck.enqueue(skew_handlers.HOLD, {"seconds": 0, "log": str(runs)}, delay_seconds=2).job
        ahead = live_deck.clock() + timedelta(seconds=3)
        assert [j.id for j in live_deck.store.claim(pool.worker_id, ahead, limit=1, types=[skew_handlers.HOLD])] == [
            job.id
        ]
        with caplog.at_level(logging.WARNING, "jobdeck.worker"):
            wait_for(
                lambda: live_deck.store.get(job.id).status is State.COMPLETED,
                timeout=20,
                message="the job given back and run",
            )
    finally:
        pool.stop(2.0)
    assert "that the pool never received" in caplog.text
    assert [r["job"] for r in skew_handlers.read(runs) if r["event"] == "done"] == [job.id]
