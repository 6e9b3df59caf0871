"""The store's lifecycle rules on a real database file."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from jobdeck.core.errors import IdempotencyConflict, NotHeld, TransitionRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter, Outcome

pytestmark = pytest.mark.backends


def test_claim_order_priority_then_available_then_id(deck: Jobdeck, clock) -> None:
    now = clock()
    low, _ = deck.enqueue("demo.noop", priority="low")
    high_later, _ = deck.enqueue("demo.noop", priority="high", run_at=(now - timedelta(seconds=1)).isoformat())
    high_earlier, _ = deck.enqueue("demo.noop", priority="high", run_at=(now - timedelta(seconds=5)).isoformat())
    critical, _ = deck.enqueue("demo.noop", priority=30)
    high_same, _ = deck.enqueue("demo.noop", priority=20, run_at=(now - timedelta(seconds=5)).isoformat())
    got = deck.store.claim("w", now, limit=10)
    assert [j.id for j in got] == [critical.id, high_earlier.id, high_same.id, high_later.id, low.id]
    assert all(j.status is State.RUNNING and j.worker_id == "w" and j.attempt == 1 for j in got)


def test_claim_only_due_and_in_batches(deck: Jobdeck, clock) -> None:
    for _ in range(5):
        deck.enqueue("demo.noop")
    future, _ = deck.enqueue("demo.noop", delay_seconds=60)
    assert future.is_scheduled(clock())
    first = deck.store.claim("w", clock(), limit=3)
    second = deck.store.claim("w", clock(), limit=10)
    assert len(first) == 3 and len(second) == 2
    assert deck.store.claim("w", clock(), limit=10) == []
    clock.advance(61)
    assert [j.id for j in deck.store.claim("w", clock(), limit=10)] == [future.id]


def test_claim_filters_by_type_and_queue(deck: Jobdeck, clock) -> None:
    a, _ = deck.enqueue("demo.noop", queue="alpha")
    b, _ = deck.enqueue("demo.sleep", queue="beta")
    assert [j.id for j in deck.store.claim("w", clock(), limit=5, types=["demo.sleep"])] == [b.id]
    assert deck.store.claim("w", clock(), limit=5, queues=["beta"]) == []
    assert [j.id for j in deck.store.claim("w", clock(), limit=5, queues=["alpha"])] == [a.id]


def test_fail_retries_with_growing_backoff_then_dead(deck: Jobdeck, clock) -> None:
    deck.config.backoff_base = 2.0
    job, _ = deck.enqueue("demo.fail", max_retries=3)
    delays = []
    for n in range(1, 5):
        (claimed,) = deck.store.claim("w", clock(), limit=1)
        after = deck.store.fail(claimed.id, "w", f"boom {n}", clock())
        if n <= 3:
            assert after.status is State.FAILED and after.retry_count == n
            delay = (after.available_at - clock()).total_seconds()
            delays.append(delay)
            assert 2.0 * 2 ** (n - 1) <= delay <= 2.0 * 2 ** (n - 1) * 1.1 + 1e-6
            assert deck.store.claim("w", clock(), limit=1) == []  # not due yet
            clock.advance(delay)
        else:
            assert after.status is State.DEAD and after.retry_count == 3
            assert after.finished_at == clock()
    assert delays == sorted(delays)
    attempts = deck.store.attempts_of(job.id)
    assert [a.attempt for a in attempts] == [1, 2, 3, 4]
    assert [a.error for a in attempts] == ["boom 1", "boom 2", "boom 3", "boom 4"]
    assert deck.store.get(job.id).error == "boom 4"


def test_backoff_is_capped(deck: Jobdeck) -> None:
    deck.config.backoff_cap = 10.0
    assert deck.backoff("demo.noop", 50) <= 10.0
    assert deck.backoff("demo.flaky", 0) <= 0.5 * 1.1  # per-type base


def test_max_retries_zero_first_failure_is_final(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.fail", max_retries=0)
    deck.store.claim("w", clock())
    assert deck.store.fail(job.id, "w", "once", clock()).status is State.DEAD


def test_non_retryable_failure_goes_dead(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.fail", max_retries=5)
    deck.store.claim("w", clock())
    after = deck.store.fail(job.id, "w", "bad input", clock(), retryable=False)
    assert after.status is State.DEAD and after.retry_count == 0


def test_fail_by_another_worker_is_refused(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.fail")
    deck.store.claim("w", clock())
    with pytest.raises(NotHeld, match="held by worker 'w'"):
        deck.store.fail(job.id, "intruder", "x", clock())
    with pytest.raises(NotHeld):
        deck.store.complete(job.id, "intruder", clock())
    assert deck.store.get(job.id).status is State.RUNNING


def test_late_result_of_an_old_attempt_is_refused(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=3)
    (first,) = deck.store.claim("w", clock())
    deck.store.fail_many([Outcome(job.id, "w", attempt=1, error="timed out after 1 s", kind="timed_out")], clock())
    clock.advance(3600)
    (second,) = deck.store.claim("w", clock())
    assert second.attempt == 2
    # The first attempt's thread finally returns: same worker, old attempt.
    assert deck.store.complete_many([Outcome(job.id, "w", attempt=1)], clock()) == []
    assert deck.store.get(job.id).status is State.RUNNING
    assert deck.store.complete_many([Outcome(job.id, "w", attempt=2)], clock()) == [job.id]
    outcomes = [(a.attempt, a.outcome) for a in deck.store.attempts_of(job.id)]
    assert outcomes == [(1, "timed_out"), (2, "completed")]


def test_complete_records_result_and_attempt(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.noop")
    deck.store.claim("w", clock())
    clock.advance(2)
    done = deck.store.complete(job.id, "w", clock(), result={"rows": 3})
    assert done.status is State.COMPLETED and done.result == {"rows": 3} and done.finished_at == clock()
    (attempt,) = deck.store.attempts_of(job.id)
    assert attempt.outcome == "completed" and attempt.duration == 2.0 and attempt.worker_id == "w"


def test_release_counts_no_retry(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=0)
    (claimed,) = deck.store.claim("w", clock())
    assert deck.store.release("w", [(job.id, claimed.attempt)], clock()) == [job.id]
    after = deck.store.get(job.id)
    assert after.status is State.PENDING and after.retry_count == 0 and after.worker_id is None
    assert deck.store.attempts_of(job.id) == []


def test_rescue_stalled_records_the_attempt(deck: Jobdeck, clock) -> None:
    fresh, _ = deck.enqueue("demo.noop", max_retries=1)
    last, _ = deck.enqueue("demo.noop", max_retries=0)
    deck.store.claim("w", clock(), limit=2)
    assert deck.store.rescue_stalled(clock() + timedelta(seconds=59), stall_timeout=60) == []
    rescued = {j.id: j for j in deck.store.rescue_stalled(clock() + timedelta(seconds=61), stall_timeout=60)}
    assert rescued[fresh.id].status is State.FAILED
    assert rescued[last.id].status is State.DEAD
    (attempt,) = deck.store.attempts_of(last.id)
    assert attempt.outcome == "stalled"
    assert attempt.error is not None and attempt.error.startswith("stalled: worker w stopped heart-beating at ")
    # A second sweep finds nothing: each job is rescued once.
    assert deck.store.rescue_stalled(clock() + timedelta(seconds=61), stall_timeout=60) == []


def test_retry_gives_a_fresh_budget_and_edit_keeps_old_payload(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.fail", {"message": "v1"}, max_retries=0)
    deck.store.claim("w", clock())
    deck.store.fail(job.id, "w", "boom", clock())
    again = deck.store.retry(job.id, clock(), payload={"message": "v2"})
    assert again.status is State.PENDING and again.retry_count == 0 and again.payload == {"message": "v2"}
    (attempt,) = deck.store.attempts_of(job.id)
    assert attempt.payload == {"message": "v1"}


def test_idempotency_key_returns_existing(deck: Jobdeck) -> None:
    first, created = deck.enqueue("demo.noop", {"a": 1}, idempotency_key="k1")
    again, created_again = deck.enqueue("demo.noop", {"a": 1}, idempotency_key="k1")
    assert created and not created_again and again.id == first.id
    with pytest.raises(IdempotencyConflict, match="a different payload"):
        deck.enqueue("demo.noop", {"a": 2}, idempotency_key="k1")
    with pytest.raises(IdempotencyConflict, match="type 'demo.noop', not 'demo.sleep'"):
        deck.enqueue("demo.sleep", {"a": 1}, idempotency_key="k1")


def test_enqueue_many_in_order_with_keys(deck: Jobdeck) -> None:
    existing, _ = deck.enqueue("demo.noop", idempotency_key="dup")
    ids = deck.enqueue_many(
        [{"type": "demo.noop", "payload": {"i": i}} for i in range(3)]
        + [{"type": "demo.noop", "idempotency_key": "dup"}, {"type": "demo.noop", "idempotency_key": "new"}]
    )
    assert len(ids) == 5 and ids[3] == existing.id
    assert [deck.store.get(i).payload for i in ids[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert deck.store.get(ids[4]).idempotency_key == "new"


def test_list_jobs_keyset_and_search(deck: Jobdeck, clock) -> None:
    ids = [deck.enqueue("demo.noop", {"n": f"order-{i}"})[0].id for i in range(7)]
    page1 = deck.store.list_jobs(JobFilter(limit=3), clock())
    page2 = deck.store.list_jobs(JobFilter(limit=3, before_id=page1[-1].id), clock())
    newer = deck.store.list_jobs(JobFilter(limit=3, after_id=page2[0].id), clock())
    assert [j.id for j in page1] == ids[::-1][:3]
    assert [j.id for j in page2] == ids[::-1][3:6]
    assert [j.id for j in newer] == [j.id for j in page1]
    assert [j.id for j in deck.store.list_jobs(JobFilter(search="order-4"), clock())] == [ids[4]]
    assert [j.id for j in deck.store.list_jobs(JobFilter(search=f"#{ids[2]}"), clock())] == [ids[2]]
    assert deck.store.list_jobs(JobFilter(search="100%_"), clock()) == []


def test_counts_split_scheduled_out_of_pending(deck: Jobdeck, clock) -> None:
    deck.enqueue("demo.noop")
    deck.enqueue("demo.noop", delay_seconds=30)
    counts = deck.store.counts(clock())
    assert counts["pending"] == 1 and counts["scheduled"] == 1 and counts["running"] == 0


def test_eight_threads_claim_2000_jobs_each_exactly_once(live_deck: Jobdeck) -> None:
    live_deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(2000)])
    claimed: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            while True:
                got = live_deck.store.claim(f"w{n}", live_deck.clock(), limit=7)
                if not got:
                    return
                claimed[n].extend(j.id for j in got)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    everything = [i for ids in claimed for i in ids]
    assert len(everything) == 2000 and len(set(everything)) == 2000
    assert sum(1 for ids in claimed if ids) > 1  # really concurrent


def test_refused_transition_is_an_error_with_state(deck: Jobdeck, clock) -> None:
    job, _ = deck.enqueue("demo.noop")
    deck.store.claim("w", clock())
    deck.store.complete(job.id, "w", clock())
    with pytest.raises(TransitionRefused) as info:
        deck.store.fail(job.id, "w", "late", clock())
    assert str(info.value) == f"job {job.id} is completed; only running jobs can be failed"
