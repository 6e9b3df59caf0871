"""What PostgreSQL adds, and what must hold the same on both databases: the
claim under concurrency, the claim's index, NOTIFY wake-up across processes,
and surviving the loss of every database connection mid-run."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.runtime import Runtime
from jobdeck.store import NewJob, Outcome, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import attempts, jobs
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import wait_for
from tests.pgtest import terminate_backends

pytestmark = pytest.mark.backends
postgres_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@pytest.fixture
def pg_schema(request, db_url):
    return request.node.pg_schema


@pytest.fixture
def other_process_store(db_url):
    """A store on its own engine: enqueues from it reach the pool only through
    the database, as from another process or host."""
    engine = make_engine(db_url, pool_size=2)
    yield Store(engine)
    engine.dispose()


def test_concurrent_claims_never_overlap_or_exceed_the_limit(deck, clock):
    deck.enqueue_many([{"type": "demo.noop", "priority": i % 3} for i in range(400)])
    claimed: list[int] = []
    batches: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            while True:
                got = deck.store.claim(f"w{n}", clock(), limit=7)
                with lock:
                    batches.append(len(got))
                    claimed.extend(j.id for j in got)
                if not got:
                    return
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(claimed) == len(set(claimed)) == 400
    assert max(batches) <= 7
    assert deck.store.counts(clock())["running"] == 400


def test_claim_takes_priority_then_age_on_both_databases(deck, clock):
    low = deck.enqueue("demo.noop", priority="low")[0]
    clock.advance(1)
    high_later = deck.enqueue("demo.noop", priority="high")[0]
    high_first = deck.enqueue("demo.noop", priority="high", delay_seconds=0)[0]
    clock.advance(1)
    got = deck.store.claim("w", clock(), limit=3)
    assert [j.id for j in got] == [high_later.id, high_first.id, low.id]


def _claim_plan(store: Store, clock, **claim_args) -> str:
    """EXPLAIN the exact statement Store.claim sends (captured as it runs)."""
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE JOBS"):
            seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        store.claim("explain", clock(), limit=10, **claim_args)
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    statement, parameters = seen[-1]
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


@postgres_only
def test_postgres_claim_uses_the_partial_claim_indexes(deck, clock):
    """Most of a real jobs table is finished; the claim must not scan it."""
    past = clock() - timedelta(hours=1)
    with deck.store.write() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries, "
                "available_at, created_at, updated_at) "
                "SELECT 'demo.noop', 'default', '{}', 0, :done, 1, 0, 3, :t, :t, :t FROM generate_series(1, 20000)"
            ),
            {"done": State.COMPLETED.value, "t": past},
        )
    deck.enqueue_many([{"type": "demo.noop"} for _ in range(300)])
    deck.enqueue_many([{"type": "demo.report", "payload": {"name": f"r{i}"}} for i in range(5)])
    with deck.store.write() as conn:
        conn.execute(text("ANALYZE jobs"))
    plan = _claim_plan(deck.store, clock)
    assert "ix_jobs_claim" in plan and "Seq Scan" not in plan, plan
    plan = _claim_plan(deck.store, clock, queues=["reports"])
    assert "ix_jobs_claim_queue" in plan and "Seq Scan" not in plan, plan


@postgres_only
@pytest.mark.slow
def test_notify_wakes_the_pool_of_another_process_and_survives_reconnects(
    make_config, registry, other_process_store, pg_schema
):
    """With a 30 s poll interval only NOTIFY can start a job promptly."""
    from jobdeck.deck import Jobdeck

    deck = Jobdeck(make_config(workers=2, poll_interval=30.0), registry)
    deck.init_db()
    runtime = Runtime(deck, services=False)
    listener = next(s for s in runtime.services if s.__class__.__name__ == "Listener")
    runtime.start()
    try:
        wait_for(listener.connected.is_set, 10, message="the listener to connect")

        def run_one(timed: bool) -> None:
            job, _ = other_process_store.enqueue(NewJob(type="demo.noop"), deck.clock())
            started = time.monotonic()
            wait_for(lambda: other_process_store.get(job.id).status is State.COMPLETED, 10,
                     message=f"job {job.id} to complete")  # fmt: skip
            if timed:
                assert time.monotonic() - started < 3.0, "woken by polling, not by NOTIFY"

        run_one(timed=False)  # the pool's start-up claim may take this one
        before = listener.received
        run_one(timed=True)  # the pool was idle, waiting 30 s: only NOTIFY woke it
        assert listener.received > before
        terminate_backends(pg_schema)  # the listener's connection too
        wait_for(lambda: listener.reconnects >= 1 and listener.connected.is_set(), 15,
                 message="the listener to reconnect")  # fmt: skip
        run_one(timed=False)
        run_one(timed=True)
    finally:
        runtime.stop(grace=5)
        deck.store.engine.dispose()


@postgres_only
def test_workers_ride_out_the_loss_of_every_connection(make_config, registry, other_process_store, pg_schema):
    """Killing every server connection mid-run (what a restart does to the
    client): workers back off and reconnect, and each accepted job completes
    exactly once."""
    from jobdeck.deck import Jobdeck

    deck = Jobdeck(make_config(workers=4, poll_interval=0.05), registry)
    deck.init_db()
    runtime = Runtime(deck, services=False)
    runtime.start()
    ids: list[int] = []
    killed = 0
    try:
        for wave in range(4):
            ids += _enqueue_retrying(other_process_store, [NewJob(type="demo.noop", payload={"w": wave, "i": i},
                                     idempotency_key=f"w{wave}-{i}") for i in range(100)], deck.clock)  # fmt: skip
            killed += terminate_backends(pg_schema)
        assert killed >= 4

        def all_completed() -> bool:
            try:
                with other_process_store.read() as conn:
                    return conn.execute(
                        select(func.count()).where(jobs.c.status == State.COMPLETED.value)
                    ).scalar_one() == len(ids)
            except SQLAlchemyError:  # its own connection was cut too: look again
                return False

        wait_for(all_completed, 60, interval=0.1, message="every job to complete")
    finally:
        runtime.stop(grace=5)
        deck.store.engine.dispose()
    assert len(set(ids)) == 400
    with other_process_store.read() as conn:
        per_job = dict(
            conn.execute(
                select(attempts.c.job_id, func.count())
                .where(attempts.c.outcome == "completed")
                .group_by(attempts.c.job_id)
            ).all()
        )
    assert set(per_job) == set(ids) and set(per_job.values()) == {1}


def _enqueue_retrying(store: Store, news: list[NewJob], clock) -> list[int]:
    """A client that retries an enqueue whose connection was cut (the
    idempotency keys make the retry safe)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return store.enqueue_many(news, clock())
        except SQLAlchemyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # a client's backoff between retries


def test_fail_then_retry_is_the_same_on_both_databases(deck, clock):
    job = deck.enqueue("demo.noop", max_retries=1)[0]
    (claimed,) = deck.store.claim("w", clock(), limit=1)
    (failed,) = deck.store.fail_many([Outcome(job.id, "w", attempt=claimed.attempt, error="boom")], clock())
    assert failed.status is State.FAILED and failed.retry_count == 1 and failed.available_at > clock()
    clock.advance(3600)
    (again,) = deck.store.claim("w", clock(), limit=1)
    (dead,) = deck.store.fail_many([Outcome(job.id, "w", attempt=again.attempt, error="boom")], clock())
    assert dead.status is State.DEAD and [a.outcome for a in deck.store.attempts_of(job.id)] == ["failed", "failed"]


def test_effects_ledger_starts_a_key_once_on_both_databases(deck, clock):
    """INSERT ... ON CONFLICT reports no rowcount on psycopg; the ledger must
    still tell the first start from the second, and restart a withdrawn key."""
    ledger = deck.store.ledger
    assert ledger.start("charge:o1", 1, 1, "w", clock()).mine is True
    assert ledger.start("charge:o1", 2, 1, "w", clock()).mine is False
    assert ledger.withdraw("charge:o1", 1, 1, clock()) is True
    assert ledger.start("charge:o1", 2, 1, "w", clock()).mine is True


def test_heartbeat_reaches_every_held_job(deck, clock):
    deck.enqueue_many([{"type": "demo.noop"} for _ in range(5)])
    held = deck.store.claim("w", clock(), limit=5)
    later = clock.advance(30)
    assert deck.store.heartbeat_worker("w", later) == 5
    assert {deck.store.get(j.id).heartbeat_at for j in held} == {later}
    assert deck.store.rescue_stalled(later, stall_timeout=10) == []
