"""More writes that reach PostgreSQL late, with a time read before they were sent.

``test_late_landing_beat`` covers the pool's beat. The same defect lives in
other writes that stamp a time the client read before the statement was
sent: a statement resent by TCP after a partition, or held behind a lock,
lands with that time, seconds old. Each test here holds the write on a
lock (the same every run) and then asks a sweeper about a worker that is
alive.

An HTTP worker has no row in ``workers``: its jobs are judged by their own
``heartbeat_at`` alone (``Store.rescue_stalled``), so a stale time written
there is enough to have a live job rescued and run a second time.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.clock import DatabaseClock
from jobdeck.jobs.flow import START_SLACK
from jobdeck.store.models import jobs
from jobdeck.store.postgres import CLAIM_LOCK
from sqlalchemy import select, text

from tests.conftest import wait_for

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

STALL = 2.0
LEASE = STALL / 2


def _job(deck: Any, job_id: int) -> Any:
    with deck.store.read() as conn:
        return conn.execute(select(jobs.c.status, jobs.c.heartbeat_at).where(jobs.c.id == job_id)).one()


def _waiting_on_a_lock(engine: Any, schema: str) -> int:
    """This test's sessions waiting on a lock (row or advisory); a fresh look each time."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND wait_event_type = 'Lock'"),
            {"name": schema},
        ).scalar_one()


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    answers: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            answers.append(target())
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="late-write")
    thread.start()
    return thread, answers, errors


def test_an_http_workers_beat_that_lands_late_does_not_move_the_jobs_heartbeat_back(
    make_deck: Any, request: Any
) -> None:
    """``POST /api/jobs/<id>/heartbeat``: the server reads its clock, then
    the UPDATE waits (here on the job's row; after a partition between the
    server and the database, in TCP's resend queue) while the worker's next
    beat, through another server process or connection, lands. The late
    one then writes its older time over the fresher one."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id
    claimed = client.post("/api/jobs/claim", json={"worker_id": "ext"}).get_json()
    assert claimed["id"] == job_id

    schema = request.node.pg_schema
    engine = deck.store.engine
    with engine.connect() as other:
        other.execute(text("SELECT 1 FROM jobs WHERE id = :j FOR UPDATE"), {"j": job_id})
        thread, answers, errors = _in_thread(
            lambda: client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "ext"}).status_code
        )
        wait_for(lambda: _waiting_on_a_lock(engine, schema), timeout=30, message="the beat waits on the job's row")
        blocked = deck.clock()  # the beat read its time before this
        wait_for(lambda: deck.clock() > blocked + timedelta(seconds=LEASE), timeout=30, message="half a stall")
        # The worker's next beat, landing first.
        fresher = other.execute(
            text("UPDATE jobs SET heartbeat_at = clock_timestamp() WHERE id = :j RETURNING heartbeat_at"),
            {"j": job_id},
        ).scalar_one()
        other.commit()
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    assert answers == [200]

    status, beat = _job(deck, job_id)
    print(f"fresher beat {fresher.isoformat()}, the job's heartbeat after the late one: {beat.isoformat()}")
    assert beat >= fresher, "the late beat moved the job's heartbeat back"
    assert deck.store.rescue_stalled(fresher + timedelta(seconds=STALL) - timedelta(microseconds=1), STALL) == []
    assert _job(deck, job_id).status == "running"


def test_a_limited_claim_that_waited_for_the_claim_lock_is_not_stalled_at_once(make_deck: Any, request: Any) -> None:
    """A claim under a concurrency limit reads its time, then waits for the
    advisory lock of limited claims (held by another process's claim, held
    up itself by a partition or a slow database). Once it gets the lock it
    stamps ``heartbeat_at`` and ``claimed_at`` with that old time: an HTTP
    worker's job is then older than ``stall_timeout`` the moment it is
    claimed, and a sweeper rescues it before the worker even got the reply
    (which it then runs, while the rescued job is retried elsewhere)."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5, types={"demo.noop": {"concurrency": 2}})
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id

    schema = request.node.pg_schema
    engine = deck.store.engine
    with engine.connect() as other:
        other.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CLAIM_LOCK})
        thread, answers, errors = _in_thread(
            lambda: client.post("/api/jobs/claim", json={"worker_id": "ext"}).get_json()
        )
        wait_for(lambda: _waiting_on_a_lock(engine, schema), timeout=30, message="the claim waits on the claim lock")
        blocked = deck.clock()
        wait_for(lambda: deck.clock() > blocked + timedelta(seconds=STALL), timeout=30, message="a stall_timeout")
        other.commit()
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [claimed] = answers
    assert claimed is not None and claimed["id"] == job_id, "the worker holds the job"

    # At once, before the worker's first beat is due: nobody may judge it stalled.
    status, beat = _job(deck, job_id)
    now = deck.clock()
    print(f"claimed job's heartbeat {beat.isoformat()}, {(now - beat).total_seconds():.2f} s old at once")
    assert deck.store.rescue_stalled(now, STALL) == [], "a job claimed a moment ago was rescued as stalled"
    assert _job(deck, job_id).status == "running"


def test_a_rate_limited_claim_that_waited_for_the_claim_lock_logs_its_starts_when_they_happened(
    make_deck: Any, request: Any
) -> None:
    """A rate-limited claim reads its time, waits for the claim lock, then
    claims and logs its starts (``flow_starts``) at that old time: the
    starts leave the rate's window early by as long as the claim waited,
    and the next claim takes a second full batch within one window."""
    rate, period, waited = 4, 3.0, 2.0
    deck = make_deck(stall_timeout=STALL, types={"demo.noop": {"rate": f"{rate}/{period:g}s"}})
    assert isinstance(deck.clock, DatabaseClock)
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(3 * rate)])

    schema = request.node.pg_schema
    engine = deck.store.engine
    with engine.connect() as other:
        other.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CLAIM_LOCK})
        thread, answers, errors = _in_thread(lambda: deck.store.claim("host-a", deck.clock(), limit=3 * rate))
        wait_for(lambda: _waiting_on_a_lock(engine, schema), timeout=30, message="the claim waits on the claim lock")
        blocked = deck.clock()  # the claim read its time before this
        wait_for(lambda: deck.clock() > blocked + timedelta(seconds=waited), timeout=30, message="the claim waited")
        released = deck.clock()  # the claim's jobs start after this
        other.commit()
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [first] = answers
    assert len(first) == rate

    # A window (the period and its slack) after the first claim read its time,
    # less than one period after its jobs started.
    window = timedelta(seconds=period + START_SLACK + 0.05)
    wait_for(lambda: deck.clock() > blocked + window, timeout=30, message="a window from the read")
    second = deck.store.claim("host-b", deck.clock(), limit=3 * rate)
    after = deck.clock()
    assert after < released + timedelta(seconds=period), "the test was too slow to tell"
    print(f"rate {rate}/{period:g}s: claimed {len(first)}, then {len(second)} "
          f"{(after - released).total_seconds():.2f} s after the first batch started")  # fmt: skip
    assert second == [], "a second batch within one window of the first's starts"
