"""Enqueue on every path: the single insert (on SQLite through the group
commit), ``enqueue_many`` plain and keyed, and the deck's bulk path; and
duplicate idempotency keys raced from 16 threads, where exactly one job may
exist and every caller must get its id."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.store.driver import Driver, race

pytestmark = pytest.mark.backends

THREADS = 16


def test_single_enqueues_from_many_threads_each_get_their_own_row(drv: Driver) -> None:
    """On SQLite the single enqueue is batched by the group commit: every
    caller must get back its own job, as stored."""
    records = race(THREADS, lambda i: drv.store.enqueue(NewJob("demo.noop", {"i": i}, queue="single"), drv.now))
    assert all(created for _, created in records)
    ids = [job.id for job, _ in records]
    assert len(set(ids)) == THREADS
    for i, (job, _) in enumerate(records):
        stored = drv.store.get(job.id)
        assert stored == job and stored.payload == {"i": i} and stored.status is State.PENDING


@pytest.mark.parametrize("path", ["store", "deck"])
def test_bulk_enqueue_keeps_order_and_fields(drv: Driver, path: str) -> None:
    later = drv.clock.now.replace(year=2027)
    items = [{"type": "demo.noop", "payload": {"i": i}, "priority": i % 3, "queue": f"b{i % 2}"} for i in range(10)]
    items[4]["run_at"] = later.isoformat()
    if path == "store":
        news = [NewJob("demo.noop", {"i": i}, queue=f"b{i % 2}", priority=i % 3) for i in range(10)]
        news[4].available_at = later
        ids = drv.store.enqueue_many(news, drv.now)
    else:
        ids = drv.deck.enqueue_many(items)
    assert ids == sorted(ids) and len(set(ids)) == 10
    for i, job_id in enumerate(ids):
        job = drv.store.get(job_id)
        assert (job.payload, job.priority, job.queue, job.status) == ({"i": i}, i % 3, f"b{i % 2}", State.PENDING)
        assert job.available_at == (later if i == 4 else drv.now)


@pytest.mark.parametrize("path", ["store", "deck"])
def test_keyed_bulk_enqueue_answers_the_existing_job_for_a_known_key(drv: Driver, path: str) -> None:
    old, _ = drv.store.enqueue(NewJob("demo.noop", idempotency_key="known"), drv.now)

    def bulk(keys: list[str | None]) -> list[int]:
        if path == "store":
            return drv.store.enqueue_many([NewJob("demo.noop", idempotency_key=k) for k in keys], drv.now)
        return drv.deck.enqueue_many([{"type": "demo.noop", "idempotency_key": k} for k in keys])

    ids = bulk([None, "known", "new", None, "new"])
    assert ids[1] == old.id and ids[2] == ids[4] and len({ids[0], ids[2], ids[3], old.id}) == 4
    assert bulk(["new", "known"]) == [ids[2], old.id]


def test_racing_duplicate_keys_make_one_job(drv: Driver) -> None:
    """The UNIQUE constraint decides (insert, on conflict do nothing, read
    back): a read-then-insert lets two callers both see no job, and one of
    them then fails or makes a second job. Several rounds: each a fresh key."""
    for round_ in range(4):
        key = f"race-{round_}"
        records = race(THREADS, lambda i, key=key: drv.store.enqueue(NewJob("demo.noop", idempotency_key=key), drv.now))
        ids = {job.id for job, _ in records}
        assert len(ids) == 1, f"{len(ids)} jobs for one key"
        assert sum(created for _, created in records) == 1, "not exactly one caller created the job"
        (job_id,) = ids
        assert drv.store.get(job_id).idempotency_key == key


@pytest.mark.parametrize("path", ["store", "deck"])
def test_racing_keyed_bulk_enqueues_make_one_job_per_key(drv: Driver, path: str) -> None:
    for round_ in range(3):
        keys: list[str | None] = [f"a{round_}", None, f"b{round_}"]

        def bulk(i: int, keys: list[str | None] = keys) -> list[int]:
            if path == "store":
                return drv.store.enqueue_many([NewJob("demo.noop", idempotency_key=k) for k in keys], drv.now)
            return drv.deck.enqueue_many([{"type": "demo.noop", "idempotency_key": k} for k in keys])

        results = race(THREADS, bulk)
        assert len({r[0] for r in results}) == 1 and len({r[2] for r in results}) == 1
        assert len({r[1] for r in results}) == THREADS, "the unkeyed jobs must all be made"
        assert results[0][0] != results[0][2]
        for key, job_id in ((keys[0], results[0][0]), (keys[2], results[0][2])):
            assert drv.store.get(job_id).idempotency_key == key


def _job_count(drv: Driver) -> int:
    with drv.store.read() as conn:
        return int(conn.execute(text("SELECT count(*) FROM jobs")).scalar_one())


@pytest.mark.parametrize("path", ["store", "deck"])
def test_a_bulk_larger_than_one_statement_keeps_every_job_in_order(drv: Driver, path: str) -> None:
    """SQLite inserts a plain bulk 1,000 rows per statement, PostgreSQL in one
    statement of arrays: the ids still come back in the items' order, each
    the id of its own job, across the statements' seams."""
    n = 2_345
    if path == "store":
        ids = drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(n)], drv.now)
    else:
        ids = drv.deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(n)])
    assert len(set(ids)) == n and ids == sorted(ids)
    for i in (0, 999, 1000, 1001, 1999, 2000, n - 1):
        job = drv.store.get(ids[i])
        assert job.payload == {"i": i} and job.status is State.PENDING and job.created_at == drv.now


def test_a_key_given_twice_in_one_bulk_makes_one_job_and_a_keyless_bulk_still_inserts(drv: Driver) -> None:
    """The partial unique index holds only keyed jobs: many keyless jobs never
    collide, a key repeated inside one bulk makes one job (both slots get its
    id), and the key is still refused to a later single enqueue."""
    ids = drv.store.enqueue_many(
        [NewJob("demo.noop", idempotency_key=k) for k in ("twice", None, "twice", None, None)], drv.now
    )
    assert ids[0] == ids[2] and len({ids[0], ids[1], ids[3], ids[4]}) == 4
    job, created = drv.store.enqueue(NewJob("demo.noop", idempotency_key="twice"), drv.now)
    assert not created and job.id == ids[0]
    assert len(drv.deck.enqueue_many([{"type": "demo.noop"}] * 5)) == 5


def test_a_nul_in_a_payload_round_trips_escaped(drv: Driver) -> None:
    """A NUL inside a payload string is JSON-escaped (``\\u0000``) by the
    deck, so PostgreSQL's text column takes it, single and in bulk."""
    single, _ = drv.deck.enqueue("demo.noop", {"s": "a\x00b"})
    (bulk,) = drv.deck.enqueue_many([{"type": "demo.noop", "payload": {"s": "c\x00d"}}])
    assert drv.store.get(single.id).payload == {"s": "a\x00b"}
    assert drv.store.get(bulk).payload == {"s": "c\x00d"}


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("keyed", [False, True])
def test_a_raw_nul_refuses_the_whole_bulk_on_postgres(drv: Driver, keyed: bool) -> None:
    """A payload text with a raw NUL (past the deck's JSON encoding) cannot be
    stored by PostgreSQL: the bulk is one statement, so it fails whole, with
    the driver's error naming the NUL, and no job of it is left behind."""
    before = _job_count(drv)
    news = [NewJob("demo.noop", idempotency_key=f"nul-{i}" if keyed else None) for i in range(3)]
    news[1].payload_json = '{"s":"a\x00b"}'
    with pytest.raises(DBAPIError, match="NUL"):
        drv.store.enqueue_many(news, drv.now)
    assert _job_count(drv) == before


@pytest.mark.parametrize("key", [None, "as-stored"])
def test_the_enqueued_record_is_the_stored_job(drv: Driver, key: str | None) -> None:
    """PostgreSQL's single enqueue reads back only the id and builds the
    rest from what it inserted: it must be the row as stored, times in UTC
    even when the run_at named another offset."""
    job, created = drv.deck.enqueue(
        "demo.noop", {"s": "é", "n": [1, 2.5]}, priority=2, queue="q1", idempotency_key=key,
        run_at="2027-03-01T12:00:00+02:00",
    )  # fmt: skip
    stored = drv.store.get(job.id)
    assert created and stored == job
    assert job.available_at.utcoffset() is not None and job.available_at.utcoffset().total_seconds() == 0
    assert job.available_at.hour == 10 and job.created_at == drv.now


def test_a_store_enqueue_at_another_offset_reads_back_in_utc(drv: Driver) -> None:
    at = drv.now.astimezone(timezone(timedelta(hours=2))) + timedelta(hours=1)
    job, _ = drv.store.enqueue(NewJob("demo.noop", available_at=at), drv.now)
    assert job == drv.store.get(job.id) and job.available_at.utcoffset() == timedelta(0)
