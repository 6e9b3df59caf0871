"""The claim on every path: bare, behind the queue policy (paused queues),
behind a concurrency limit (the policy's own count-then-claim), and as the
second half of the acker's ``complete_and_claim``. It never hands a job out
twice across concurrent claimers, takes jobs by priority, then
``available_at``, then id, and never takes a future job or a paused
queue's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import fields
from datetime import timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.store import JobRecord, NewJob, Outcome, Store

from tests.conftest import wait_for
from tests.store.driver import Driver, race

pytestmark = pytest.mark.backends

CLAIMERS: dict[str, Callable[[Driver], Store]] = {
    "claim": lambda d: d.store,
    "claim_policy": lambda d: d.policy,
    "claim_limited": lambda d: d.limited,
    "complete_and_claim": lambda d: d.store,
}


def claim_with(drv: Driver, path: str, worker: str, limit: int, done: list[JobRecord] | None = None) -> list[JobRecord]:
    store = CLAIMERS[path](drv)
    if path == "complete_and_claim":
        outcomes = [Outcome(j.id, worker, attempt=j.attempt) for j in done or []]
        accepted, claimed = store.complete_and_claim(outcomes, worker, drv.now, limit=limit)
        assert sorted(accepted) == sorted(j.id for j in done or [])
        return claimed
    return store.claim(worker, drv.now, limit=limit)


@pytest.mark.parametrize("path", sorted(CLAIMERS))
def test_concurrent_claimers_never_get_the_same_job(drv: Driver, path: str) -> None:
    total, threads = 240, 6
    ids = set(drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(total)], drv.now))
    CLAIMERS[path](drv)  # built before the race
    got: list[list[JobRecord]] = [[] for _ in range(threads)]
    lock = threading.Lock()
    seen: dict[int, str] = {}

    def claimer(i: int) -> None:
        worker, last, empty = f"c{i}", [], 0
        while empty < 3:
            batch = claim_with(drv, path, worker, 4, last)
            last = batch
            empty = 0 if batch else empty + 1
            got[i].extend(batch)
            with lock:
                for j in batch:
                    assert j.id not in seen, f"job {j.id} claimed by {seen[j.id]} and {worker}"
                    seen[j.id] = worker

    race(threads, claimer)
    claimed = [j.id for batch in got for j in batch]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) == ids
    assert all(j.attempt == 1 and j.status is State.RUNNING for batch in got for j in batch)


@pytest.mark.parametrize("path", sorted(CLAIMERS))
def test_claim_order_and_no_future_job(drv: Driver, path: str) -> None:
    now = drv.now
    spec = [  # (priority, seconds before now); the negative one is in the future
        (0, 10), (5, 1), (5, 30), (0, 30), (10, 0), (5, 30), (10, -1), (0, 20),
    ]  # fmt: skip
    news = [
        NewJob("demo.noop", {"n": n}, priority=p, available_at=now - timedelta(seconds=s))
        for n, (p, s) in enumerate(spec)
    ]
    ids = drv.store.enqueue_many(news, now)
    future = ids[6]
    expected = [
        job_id
        for job_id, _ in sorted(
            ((job_id, spec[n]) for n, job_id in enumerate(ids) if job_id != future),
            key=lambda x: (-x[1][0], -x[1][1], x[0]),
        )
    ]
    order: list[int] = []
    last: list[JobRecord] = []
    for _ in range(len(spec) + 2):
        last = claim_with(drv, path, "w", 1, last)
        order.extend(j.id for j in last)
    assert order == expected, "claim order is priority DESC, available_at, id"
    assert drv.store.get(future).status is State.PENDING
    drv.clock.advance(1)
    assert [j.id for j in claim_with(drv, path, "w", 5, last)] == [future]


@pytest.mark.parametrize("path", ["claim_policy", "claim_limited"])
def test_a_paused_queue_is_not_claimed_from(drv: Driver, path: str) -> None:
    paused = drv.enqueue(queue="held", priority=100)
    other = drv.enqueue(queue="open")
    r = drv.client.post("/api/queues/held/pause")
    assert r.status_code == 200 and r.get_json()["paused"] is True
    assert [j.id for j in claim_with(drv, path, "w", 10)] == [other.id]
    assert claim_with(drv, path, "w", 10) == []
    assert drv.store.get(paused.id).status is State.PENDING
    assert drv.client.post("/api/queues/held/resume").get_json()["paused"] is False
    store = CLAIMERS[path](drv)
    # A deck re-reads the paused set at most every poll_interval: the resume reaches it within that.
    resumed = wait_for(lambda: store.claim("w", drv.now, limit=10), timeout=5, message="the resume")
    assert [j.id for j in resumed] == [paused.id]


def test_a_concurrency_limit_caps_running_jobs(drv: Driver) -> None:
    limit = drv.limits["limited"]
    ids = drv.store.enqueue_many([NewJob("demo.noop", queue="limited") for _ in range(limit + 3)], drv.now)
    first = drv.limited.claim("w", drv.now, limit=10)
    assert [j.id for j in first] == ids[:limit]
    assert drv.limited.claim("w", drv.now, limit=10) == []
    accepted, refill = drv.limited.complete_and_claim([Outcome(first[0].id, "w", attempt=1)], "w", drv.now, limit=10)
    assert accepted == [first[0].id] and [j.id for j in refill] == [ids[limit]]


@pytest.mark.parametrize("path", sorted(CLAIMERS))
def test_a_claimed_record_is_the_row_as_stored(drv: Driver, path: str) -> None:
    """The claim returns only the columns it did not set and fills in the
    rest (running, the worker, now, no progress): each record must still be
    the row exactly as a read gives it, whatever the job went through."""
    store, now = drv.store, drv.now
    plain, keyed, retried = store.enqueue_many(
        [
            NewJob("demo.noop", {"n": [1, "two", None]}, priority=3),
            NewJob("demo.noop", {}, idempotency_key="k-1", max_retries=0),
            NewJob("demo.noop", {"again": True}, max_retries=3),
        ],
        now,
    )
    (first,) = [j for j in store.claim("w0", now, limit=3) if j.id == retried]
    store.release("w0", [(plain, 1), (keyed, 1)], now)
    store.fail_many([Outcome(retried, "w0", attempt=first.attempt, error="boom", retryable=True)], now)
    drv.clock.advance(3600)
    claimed = claim_with(drv, path, "w1", 5)
    assert sorted(j.id for j in claimed) == sorted([plain, keyed, retried])
    for job in claimed:
        assert job == store.get(job.id)
        assert vars(job).keys() == {f.name for f in fields(JobRecord)}  # none left to a class default
    assert {j.id: (j.attempt, j.error) for j in claimed}[retried] == (2, "boom")
