"""Enqueue on every path: the single insert (on SQLite through the group
commit), ``enqueue_many`` plain and keyed, and the deck's bulk path; and
duplicate idempotency keys raced from 16 threads, where exactly one job may
exist and every caller must get its id."""

from __future__ import annotations

import pytest

from app.states import State
from app.store import NewJob
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
