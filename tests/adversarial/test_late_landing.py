"""Writes that reach PostgreSQL late, with a time read before they were sent.

Sent into a partition, a statement waits in TCP's resend queue and reaches
the server seconds after its time was read, once the network is back; held
on a lock, it lands when the lock goes. Written with the time read before,
such writes

- moved a pool's heartbeat back past a fresher beat's, and a sweeper rescued
  the jobs of a live worker (a host cut off for 0.7 of ``stall_timeout`` had
  one of its jobs rescued and run a second time: ``test_partition``, seen on
  a busy machine);
- moved an HTTP worker's job heartbeat back the same way (an HTTP worker has
  no row of its own: its jobs are judged by their own heartbeat alone);
- stamped a job claimed under limits, after a long wait for the limited
  claims' lock, already older than ``stall_timeout``, and logged a rate
  limit's starts early by the wait;
- stamped a job claimed with no limits (one statement, held up on its way
  or on a lock) the same way.

Each test holds the write on a lock (the same every run), lets the deck's
clock run past what matters, and, for a heartbeat, lands a fresher one first.
A claim re-reads the deck's own clock after the wait; a clock a test
injected is left alone (the last tests, on SQLite, whose write lock makes a
claim wait as PostgreSQL's advisory lock does).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.clock import DatabaseClock
from jobdeck.jobs.flow import START_SLACK
from jobdeck.runtime import pool_for
from jobdeck.store.models import flow_starts, jobs, workers
from jobdeck.store.postgres import CLAIM_LOCK
from sqlalchemy import select, text

from tests.conftest import Clock, wait_for

ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

STALL = 2.0
LEASE = STALL / 2
"""A pool's lease: past it a beat is void."""


@dataclass
class Held:
    """What ``held_on_a_lock`` saw: the call's answer, the fresher value
    written first (if any), and the deck's time once the call waited on the
    lock (it read its time before) and when the lock went."""

    answer: Any
    fresher: Any
    blocked: datetime
    released: datetime


def held_on_a_lock(
    deck: Any, schema: str, lock: str, params: dict[str, Any], call: Any, hold: float, fresher: str | None = None
) -> Held:
    """Take ``lock`` on another connection, run ``call`` on a thread until it
    waits on it, let ``hold`` seconds of the deck's clock pass after that
    (the call read its time before), run ``fresher`` (an UPDATE ...
    RETURNING, the write that lands first) and let the lock go."""
    engine = deck.store.engine
    with engine.connect() as other:
        other.execute(text(lock), params)
        thread, answers, errors = _in_thread(call)
        wait_for(lambda: _waiting_on_a_lock(engine, schema), timeout=30, message="the write waits on the lock")
        blocked = deck.clock()
        wait_for(lambda: deck.clock() > blocked + timedelta(seconds=hold), timeout=30, message=f"{hold} s")
        first = other.execute(text(fresher), params).scalar_one() if fresher else None
        released = deck.clock()
        other.commit()
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    return Held(answers[0], first, blocked, released)


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    """``target`` run on a thread of its own: its answer, or what it raised."""
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


def _waiting_on_a_lock(engine: Any, schema: str) -> int:
    """This test's sessions waiting on a lock (row or advisory); a fresh look
    each time (a transaction reads ``pg_stat_activity`` once)."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND wait_event_type = 'Lock'"),
            {"name": schema},
        ).scalar_one()


def _job(deck: Any, job_id: int) -> Any:
    with deck.store.read() as conn:
        return conn.execute(select(jobs.c.status, jobs.c.heartbeat_at).where(jobs.c.id == job_id)).one()


@ON_POSTGRES
def test_a_pool_beat_that_lands_late_does_not_move_the_heartbeat_back(make_deck: Any, request: Any) -> None:
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    assert isinstance(deck.clock, DatabaseClock)  # the deck's own clock on PostgreSQL
    pool = pool_for(deck, 1)  # registered, not started: no beat lands but the test's own
    worker = pool.worker_id
    deck.store.register_worker(worker, "host-a", 4242, 1, deck.clock())
    job_id = deck.enqueue("demo.noop", {}).job.id
    [claimed] = deck.store.claim(worker, deck.clock(), limit=1)
    assert claimed.id == job_id and pool.lease.ttl == LEASE

    held = held_on_a_lock(
        deck, request.node.pg_schema, "SELECT 1 FROM workers WHERE id = :w FOR UPDATE", {"w": worker},
        pool.heart.heartbeat_once, LEASE,
        fresher="UPDATE workers SET heartbeat_at = clock_timestamp() WHERE id = :w RETURNING heartbeat_at",
    )  # fmt: skip
    with deck.store.read() as conn:
        beat = conn.execute(select(workers.c.heartbeat_at).where(workers.c.id == worker)).scalar_one()
    print(f"a fresher beat landed at {held.fresher.isoformat()}; the worker's heartbeat after the late one: "
          f"{beat.isoformat()}")  # fmt: skip
    assert beat >= held.fresher, "the late beat moved the worker's heartbeat back"
    # A sweeper whose cutoff falls between the late beat's time and the
    # fresher beat rescues nothing: the worker is alive. (The held job's own
    # beat went first and was not held up: row locks make the beat skip a
    # job, not wait for it; its heartbeat is older than the cutoff either way.)
    assert deck.store.rescue_stalled(held.fresher + timedelta(seconds=STALL, microseconds=-1), STALL) == []


@ON_POSTGRES
def test_an_http_workers_beat_that_lands_late_does_not_move_the_jobs_heartbeat_back(
    make_deck: Any, request: Any
) -> None:
    """``POST /api/jobs/<id>/heartbeat``: the server reads its clock, then
    the UPDATE waits (here on the job's row; after a partition between the
    server and the database, in TCP's resend queue) while the worker's next
    beat, through another server process or connection, lands."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id
    claimed = client.post("/api/jobs/claim", json={"worker_id": "ext"}).get_json()
    assert claimed["id"] == job_id

    held = held_on_a_lock(
        deck, request.node.pg_schema, "SELECT 1 FROM jobs WHERE id = :j FOR UPDATE", {"j": job_id},
        lambda: client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "ext"}).status_code, LEASE,
        fresher="UPDATE jobs SET heartbeat_at = clock_timestamp() WHERE id = :j RETURNING heartbeat_at",
    )  # fmt: skip
    assert held.answer == 200
    status, beat = _job(deck, job_id)
    print(f"fresher beat {held.fresher.isoformat()}, the job's heartbeat after the late one: {beat.isoformat()}")
    assert beat >= held.fresher, "the late beat moved the job's heartbeat back"
    assert deck.store.rescue_stalled(held.fresher + timedelta(seconds=STALL, microseconds=-1), STALL) == []
    assert _job(deck, job_id).status == "running"


def _held_claim(deck: Any, request: Any, client: Any, body: dict[str, Any]) -> Held:
    """An HTTP worker's claim whose statements wait past ``stall_timeout``
    on a lock of the jobs table (as a migration or a bulk action takes it)."""
    return held_on_a_lock(
        deck, request.node.pg_schema, "LOCK TABLE jobs IN SHARE MODE", {},
        lambda: client.post("/api/jobs/claim", json=body).get_json(), STALL,
    )  # fmt: skip


def _judge(deck: Any, job_id: int, held: Held) -> None:
    """The job an HTTP worker claimed a moment ago, behind a lock: stamped
    after the wait, and not stalled (nobody may rescue it before its first
    beat is due)."""
    status, beat = _job(deck, job_id)
    now = deck.clock()
    print(f"claimed job's heartbeat {beat.isoformat()}, {(now - beat).total_seconds():.2f} s old at once; "
          f"lock released at {held.released.isoformat()}")  # fmt: skip
    rescued = [r.id for r in deck.store.rescue_stalled(now, STALL)]
    assert job_id not in rescued, f"job {job_id}, claimed a moment ago, was rescued as stalled ({rescued})"
    assert beat >= held.released - timedelta(seconds=0.5), "the claim stamped the time read before it landed"
    assert _job(deck, job_id).status == "running"


@ON_POSTGRES
def test_a_limited_claim_that_waited_for_the_claim_lock_is_not_stalled_at_once(make_deck: Any, request: Any) -> None:
    """A claim under a concurrency limit reads its time, then waits for the
    advisory lock of limited claims (held by another process's claim, held
    up itself by a partition or a slow database). Stamped with the time
    from before the wait, an HTTP worker's job was older than
    ``stall_timeout`` the moment it was claimed, and a sweeper rescued it
    before the worker even got the reply."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5, types={"demo.noop": {"concurrency": 2}})
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id

    held = held_on_a_lock(
        deck, request.node.pg_schema, "SELECT pg_advisory_xact_lock(:k)", {"k": CLAIM_LOCK},
        lambda: client.post("/api/jobs/claim", json={"worker_id": "ext"}).get_json(), STALL,
    )  # fmt: skip
    assert held.answer is not None and held.answer["id"] == job_id, "the worker holds the job"
    _judge(deck, job_id, held)  # at once, before the worker's first beat is due


def _a_type_at_its_limit(deck: Any, client: Any) -> None:
    """``demo.sleep`` (concurrency 1) running, and the claim having seen it
    full: the pipelined batch then sends no plain claim (``_send_plain``,
    with no types named), and the claim is ``picked``: the due read, then
    ``claim_ids``, whatever type the worker takes."""
    limited = deck.enqueue("demo.sleep", {}).job.id
    assert client.post("/api/jobs/claim", json={"worker_id": "busy"}).get_json()["id"] == limited
    assert client.post("/api/jobs/claim", json={"worker_id": "busy"}).get_json() is None


def _a_paused_queue(deck: Any, client: Any) -> None:
    """A paused queue the claim leaves out: with the types and queues named,
    the voidable statement's values in their order (void_at last)."""
    deck.enqueue("demo.noop", {}, queue="held")
    assert client.post("/api/queues/held/pause", json={}).status_code in (200, 201)


NAMED = {"worker_id": "ext", "types": ["demo.noop", "demo.fail"], "queues": ["default", "held"]}
LATE_CLAIMS: dict[str, tuple[dict[str, Any], Any, dict[str, Any]]] = {
    "plain": ({}, None, {"worker_id": "ext"}),
    "beside-a-full-concurrency-limit": ({"demo.sleep": {"concurrency": 1}}, _a_type_at_its_limit, {"worker_id": "ext"}),
    "under-a-rate": ({"demo.noop": {"rate": "100/1s"}}, None, {"worker_id": "ext"}),
    "named-types-and-queues-one-paused": ({}, _a_paused_queue, NAMED),
}
"""(types config, what is set up first, the claim's body): each claim's
last statement is a different one (``claim_statements.claim``, ``claim_ids``,
``claim_ids_logging``)."""


@ON_POSTGRES
@pytest.mark.parametrize("case", list(LATE_CLAIMS))
def test_a_claim_that_lands_late_is_not_stalled_at_once(make_deck: Any, request: Any, case: str) -> None:
    """An HTTP worker's claim reads the server's clock, and its last
    statement reaches the database late (resent after a partition; held here
    on a lock of the jobs table, as a migration or a bulk action takes it).
    Stamped with the time from before, the job was older than
    ``stall_timeout`` the moment it was claimed, and a sweeper rescued it
    before the worker's first beat: it ran twice. Under a rate, the start
    it logs is stamped as it lands too. (A review of the first fix, for the
    plain claim alone, found the claims under limits left out.)"""
    types, prepare, body = LATE_CLAIMS[case]
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5, types=types)
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    if prepare is not None:
        prepare(deck, client)
    job_id = deck.enqueue("demo.noop", {}).job.id

    held = _held_claim(deck, request, client, body)
    assert held.answer is not None and held.answer["id"] == job_id, "the worker holds the job"
    _judge(deck, job_id, held)
    with deck.store.read() as conn:
        starts = conn.execute(select(flow_starts.c.started_at)).scalars().all()
    assert len(starts) == (case == "under-a-rate")
    assert all(s >= held.released - timedelta(seconds=0.5) for s in starts), "a start logged at the time read before"


@ON_POSTGRES
def test_a_rate_limited_claim_that_waited_for_the_claim_lock_logs_its_starts_when_they_happened(
    make_deck: Any, request: Any
) -> None:
    """A rate-limited claim reads its time, waits for the claim lock, then
    claims and logs its starts (``flow_starts``). Logged at the time from
    before the wait, the starts left the rate's window early by as long as
    the claim waited, and the next claim took a second full batch within
    one window."""
    rate, period, waited = 4, 3.0, 2.0
    deck = make_deck(stall_timeout=STALL, types={"demo.noop": {"rate": f"{rate}/{period:g}s"}})
    assert isinstance(deck.clock, DatabaseClock)
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(3 * rate)])

    held = held_on_a_lock(
        deck, request.node.pg_schema, "SELECT pg_advisory_xact_lock(:k)", {"k": CLAIM_LOCK},
        lambda: deck.store.claim("host-a", deck.clock(), limit=3 * rate), waited,
    )  # fmt: skip
    assert len(held.answer) == rate
    # A window (the period and its slack) after the first claim read its time,
    # less than one period after its jobs started.
    window = timedelta(seconds=period + START_SLACK + 0.05)
    wait_for(lambda: deck.clock() > held.blocked + window, timeout=30, message="a window from the read")
    second = deck.store.claim("host-b", deck.clock(), limit=3 * rate)
    after = deck.clock()
    assert after < held.released + timedelta(seconds=period), "the test was too slow to tell"
    print(f"rate {rate}/{period:g}s: claimed {len(held.answer)}, then {len(second)} "
          f"{(after - held.released).total_seconds():.2f} s after the first batch started")  # fmt: skip
    assert second == [], "a second batch within one window of the first's starts"


def _write_locked(deck: Any) -> sqlite3.Connection:
    """Another process's writer: the SQLite file's write lock, held until commit."""
    other = sqlite3.connect(deck.store.engine.url.database, isolation_level=None, timeout=30)
    other.execute("BEGIN IMMEDIATE")
    return other


def _claimed_behind_the_write_lock(deck: Any, now: Any, limit: int) -> Any:
    """A claim at ``now`` (an injected time) that waits 0.6 s of real time,
    longer than ``WAITED``, for SQLite's write lock, held by another writer."""
    with closing(_write_locked(deck)) as other:
        thread, answers, errors = _in_thread(lambda: deck.store.claim("host-a", now, limit=limit))
        began = time.monotonic()
        wait_for(lambda: time.monotonic() > began + 0.6, timeout=30, message="longer than WAITED, real time")
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    return answers[0]


def test_sqlite_plain_claim_that_waited_for_the_write_lock_is_not_stalled_at_once(make_deck: Any) -> None:
    """The same on SQLite, on the host's clock: an HTTP worker's claim reads
    the time, then waits for the file's write lock (another process's long
    write) past ``stall_timeout``."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id

    with closing(_write_locked(deck)) as other:
        thread, answers, errors = _in_thread(
            lambda: client.post("/api/jobs/claim", json={"worker_id": "ext"}).get_json()
        )
        began = deck.clock()
        wait_for(lambda: deck.clock() > began + timedelta(seconds=STALL), timeout=30, message="past stall_timeout")
        released = deck.clock()
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    assert answers[0] is not None and answers[0]["id"] == job_id, "the worker holds the job"
    status, beat = _job(deck, job_id)
    now = deck.clock()
    print(f"claimed job's heartbeat {beat.isoformat()}, {(now - beat).total_seconds():.2f} s old at once")
    assert beat >= released - timedelta(seconds=0.5), "the claim stamped the time read before it waited"
    assert deck.store.rescue_stalled(now, STALL) == [], "a job claimed a moment ago was rescued as stalled"


def test_sqlite_acker_refill_that_waited_for_the_write_lock_logs_rate_starts_when_they_happened(make_deck: Any) -> None:
    """The pool's acker refills with ``complete_and_claim``: on SQLite its own
    ``write()`` takes the file's write lock (BEGIN IMMEDIATE) before the flow
    claim begins. Measured from the claim's start (as first fixed), that
    wait was not seen: the starts were logged at the time read before it,
    and a claim a window after that read (less than a period after the jobs
    started) took a second full batch."""
    rate, period, waited = 4, 3.0, 2.0
    deck = make_deck(types={"demo.noop": {"rate": f"{rate}/{period:g}s"}})
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(3 * rate)])

    with closing(_write_locked(deck)) as other:
        read = deck.clock()  # the acker read its time, then waits for the file's write lock
        thread, answers, errors = _in_thread(lambda: deck.store.complete_and_claim([], "host-a", read, limit=3 * rate))
        wait_for(lambda: deck.clock() > read + timedelta(seconds=waited), timeout=30, message="the refill waited")
        released = deck.clock()  # the refill's jobs start after this
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [(_, first)] = answers
    assert len(first) == rate

    window = timedelta(seconds=period + START_SLACK + 0.05)
    wait_for(lambda: deck.clock() > read + window, timeout=30, message="a window from the read")
    second = deck.store.claim("host-b", deck.clock(), limit=3 * rate)
    after = deck.clock()
    assert after < released + timedelta(seconds=period), "the test was too slow to tell"
    print(f"claimed {len(first)} (claimed_at {first[0].claimed_at}), then {len(second)} "
          f"{(after - released).total_seconds():.2f} s after the first batch started")  # fmt: skip
    assert second == [], "a second batch within one window of the first's starts"


def test_fixed_clock_rate_limited_claim_logs_its_start_at_the_injected_time(make_deck: Any) -> None:
    """An injected clock: the claim reads T and waits (another writer holds
    SQLite's lock longer than ``WAITED``, in real time). It logs its start at
    T: plus the real wait (as first fixed), a claim one window later on the
    injected time line found the start still in it."""
    clock = Clock()
    t = clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"rate": "1/1s"}})
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(2)])

    [first] = _claimed_behind_the_write_lock(deck, t, limit=2)
    with deck.store.read() as conn:
        claimed_at = conn.execute(select(jobs.c.claimed_at).where(jobs.c.id == first.id)).scalar_one()
    print(f"injected clock {t.isoformat()}, claimed_at {claimed_at.isoformat()}")

    clock.advance(1 + START_SLACK + 0.01)  # one window of the injected clock later
    second = deck.store.claim("host-a", clock(), limit=2)
    assert len(second) == 1, "a window after the first start (injected time), the rate refused"
    assert claimed_at == t, "the claim stamped the injected time plus real elapsed time"


def test_fixed_clock_concurrency_limited_claim_takes_a_job_not_due_on_the_injected_clock(make_deck: Any) -> None:
    """``controls.claim_due`` reads the due jobs with the time after the wait.
    With an injected clock at T and the real wait added to it (as first
    fixed), a job due at T + 0.3 s was claimed after 0.6 s of real waiting."""
    clock = Clock()
    t = clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"concurrency": 2}})
    later = deck.enqueue("demo.noop", {}, delay_seconds=0.3).job.id

    claimed = _claimed_behind_the_write_lock(deck, t, limit=1)
    print(f"injected clock {t.isoformat()}, job {later} due at +0.3 s; claimed {[j.id for j in claimed]}")
    assert claimed == [], "a job not yet due on the claim's clock was claimed"
