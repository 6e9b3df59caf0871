"""A heartbeat whose statement reaches PostgreSQL late.

Sent into a partition, a beat's statement waits in TCP's resend queue and
reaches the server seconds after its time was read, when the network is
back; by then a fresher beat of the same pool may have landed. Written with
the time read when it was sent, the late beat moved the worker's heartbeat
back, and a sweeper rescued the jobs of a live worker: a host cut off for
0.7 of ``stall_timeout`` had one of its jobs rescued and run a second time
(``test_partition``, seen on a busy machine). A beat that reaches the
server after the lease it would renew has run out (half of
``stall_timeout`` after its time) is now void.

Here the delay is a row lock instead of a partition, so it is the same
every run: the pool's beat reads its time, then waits on the worker's row
while another transaction writes a fresher beat; the lock goes once the
beat's lease has run out, and the late beat lands.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.clock import DatabaseClock
from jobdeck.runtime import pool_for
from jobdeck.store.models import jobs, workers
from sqlalchemy import select, text

from tests.conftest import wait_for

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

STALL = 2.0


def _worker_heartbeat(deck: Any, worker: str) -> Any:
    with deck.store.read() as conn:
        return conn.execute(select(workers.c.heartbeat_at).where(workers.c.id == worker)).scalar_one()


def _waiting_on_a_lock(engine: Any, schema: str) -> int:
    """This test's sessions waiting on a lock (a fresh look: a transaction
    reads ``pg_stat_activity`` once)."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND wait_event_type = 'Lock'"),
            {"name": schema},
        ).scalar_one()


def test_a_beat_that_lands_late_does_not_move_the_heartbeat_back(make_deck: Any, request: Any) -> None:
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    assert isinstance(deck.clock, DatabaseClock)  # the deck's own clock on PostgreSQL
    pool = pool_for(deck, 1)  # registered, not started: no beat lands but the test's own
    worker = pool.worker_id
    deck.store.register_worker(worker, "host-a", 4242, 1, deck.clock())
    job_id = deck.enqueue("demo.noop", {}).job.id
    [claimed] = deck.store.claim(worker, deck.clock(), limit=1)
    assert claimed.id == job_id
    lease = pool.lease.ttl

    schema = request.node.pg_schema
    engine = deck.store.engine
    late: list[BaseException] = []

    def beat() -> None:
        try:
            pool.heart.heartbeat_once()
        except BaseException as exc:  # reported by the test, not lost in the thread
            late.append(exc)

    with engine.connect() as other:
        other.execute(text("SELECT 1 FROM workers WHERE id = :w FOR UPDATE"), {"w": worker})
        sent = deck.clock()  # no later than the time the late beat reads
        thread = threading.Thread(target=beat, name="late-beat")
        thread.start()
        wait_for(lambda: _waiting_on_a_lock(engine, schema), timeout=30, message="the beat waits on the worker's row")
        blocked = deck.clock()  # the beat read its time before this
        wait_for(lambda: deck.clock() > blocked + timedelta(seconds=lease), timeout=30, message="its lease ran out")
        # A fresher beat of the same pool, on another connection, lands first.
        fresher = other.execute(
            text("UPDATE workers SET heartbeat_at = clock_timestamp() WHERE id = :w RETURNING heartbeat_at"),
            {"w": worker},
        ).scalar_one()
        other.commit()
    thread.join(timeout=30)
    assert not thread.is_alive() and not late, late

    worker_beat = _worker_heartbeat(deck, worker)
    print(f"beat sent at {sent.isoformat()}, a fresher one landed at {fresher.isoformat()}, "
          f"the worker's heartbeat after the late one: {worker_beat.isoformat()}")  # fmt: skip
    assert worker_beat >= fresher, "the late beat moved the worker's heartbeat back"

    # A sweeper whose cutoff falls between the time the late beat was sent and
    # the fresher beat rescues nothing: the worker is alive. (The held job's
    # own beat went first and was not held up: row locks make the beat skip a
    # job, not wait for it; its heartbeat is older than the cutoff either way.)
    assert deck.store.rescue_stalled(fresher + timedelta(seconds=STALL) - timedelta(microseconds=1), STALL) == []
    with deck.store.read() as conn:
        assert conn.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one() == "running"
