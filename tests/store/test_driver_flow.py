"""The flow claim (``jobdeck.store.flow``) on both databases: the rate window's
edges, keys and the null bucket, per-key concurrency combined with a global
limit, racing claimers, and a hot key's 90k backlog that must cost a claim
nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import NewJob, Outcome
from jobdeck.store.models import flow_starts, jobs
from sqlalchemy import func, select, text

from tests.conftest import Clock

pytestmark = pytest.mark.backends

RATE = {"types": {"demo.noop": {"rate": "3/10s"}}}


def test_the_rate_window_slides_start_by_start(make_deck: Callable[..., Jobdeck]) -> None:
    clock = Clock()
    deck = make_deck(clock=clock, **RATE)
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(8)])
    assert len(deck.store.claim("w", clock.now, limit=2)) == 2
    clock.advance(4)
    assert len(deck.store.claim("w", clock.now, limit=5)) == 1  # 3 in the window
    clock.advance(5.9)
    assert deck.store.claim("w", clock.now, limit=5) == []  # the first two are 9.9 s old
    clock.advance(0.3)  # 10.2 s: past the window, inside its 0.25 s slack
    assert deck.store.claim("w", clock.now, limit=5) == []
    clock.advance(0.1)  # 10.3 s: past the slack too
    assert len(deck.store.claim("w", clock.now, limit=5)) == 2
    assert deck.store.claim("w", clock.now, limit=5) == []
    clock.advance(4)
    assert len(deck.store.claim("w", clock.now, limit=5)) == 1


def test_a_claim_with_an_older_clock_still_sees_newer_starts(make_deck: Callable[..., Jobdeck]) -> None:
    """A claimer that read its clock before waiting for the lock claims at
    an earlier ``now`` than the claim that committed first: the window
    counts every start after its beginning, later ones included."""
    clock = Clock()
    deck = make_deck(clock=clock, **RATE)
    deck.enqueue_many([{"type": "demo.noop"} for _ in range(6)])
    assert len(deck.store.claim("w", clock.now, limit=3)) == 3
    assert deck.store.claim("w", clock.now - timedelta(seconds=5)) == []


def test_a_keyed_rate_counts_each_key_and_the_missing_key_as_one_bucket(make_deck: Callable[..., Jobdeck]) -> None:
    clock = Clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"rate": "2/60s", "rate_key": "payload.account"}})
    payloads = [{"account": "a"}] * 3 + [{"account": 7}] * 3 + [{"account": "7"}] * 3 + [{}] * 2 + [{"account": None}]
    deck.enqueue_many([{"type": "demo.noop", "payload": p} for p in payloads])
    claimed = deck.store.claim("w", clock.now, limit=50)
    got = Counter(repr(j.payload.get("account")) for j in claimed)
    assert got == {"'a'": 2, "7": 2, "'7'": 2, "None": 2}  # 7 and "7" differ; missing and null share a bucket
    assert deck.store.claim("w", clock.now, limit=50) == []
    with deck.store.read() as conn:
        assert conn.execute(select(func.sum(flow_starts.c.count))).scalar_one() == 8  # a row per key and claim


def test_concurrency_per_key_combines_with_the_queue_limit(make_deck: Callable[..., Jobdeck]) -> None:
    clock = Clock()
    deck = make_deck(
        clock=clock,
        types={"demo.sleep": {"concurrency": 2, "concurrency_key": "payload.c"}},
        queues={"default": {"concurrency": 5}},
    )
    deck.enqueue_many([{"type": "demo.sleep", "payload": {"c": c}} for c in "aaaabbbbcccc"])
    first = deck.store.claim("w", clock.now, limit=50)
    assert len(first) == 5  # the queue's 5, at most 2 per key
    assert max(Counter(j.payload["c"] for j in first).values()) == 2
    deck.store.complete(first[0].id, "w", clock.now)
    more = deck.store.claim("w", clock.now, limit=50)
    running = Counter(j.payload["c"] for j in first[1:] + more)
    assert len(more) == 1 and max(running.values()) == 2


def test_racing_claimers_never_run_two_jobs_of_one_key(make_deck: Callable[..., Jobdeck]) -> None:
    """Four threads, two decks (two processes' policies) claiming at once."""
    option = {"types": {"demo.sleep": {"concurrency": 1, "concurrency_key": "payload.c"}}}
    decks = [make_deck(**option), make_deck(**option)]
    decks[0].enqueue_many([{"type": "demo.sleep", "payload": {"c": f"k{i % 5}"}} for i in range(60)])
    claimed: list[Any] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def claim(deck: Jobdeck, name: str) -> None:
        barrier.wait()
        for _ in range(10):
            got = deck.store.claim(name, deck.clock(), limit=3)
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=claim, args=(decks[i % 2], f"w{i}")) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    keys = Counter(j.payload["c"] for j in claimed)
    assert keys == dict.fromkeys([f"k{i}" for i in range(5)], 1)


def _fill(deck: Jobdeck, key: str, n: int, priority: int) -> None:
    news = [NewJob("demo.sleep", {"c": key}, priority=priority, concurrency_key=f'"{key}"') for _ in range(n)]
    for i in range(0, n, 10_000):
        deck.store.enqueue_many(news[i : i + 10_000], deck.clock())


def _timed_claims(deck: Jobdeck, clock: Clock, n: int = 7) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        got = deck.store.claim("w", clock.now, limit=10)
        took.append(time.perf_counter() - t0)
        assert len(got) == 10 and not any(j.payload["c"] == "hot" for j in got), [j.payload for j in got]
    return took


@pytest.mark.slow
def test_a_hot_keys_backlog_of_90k_costs_a_claim_nothing(make_deck: Callable[..., Jobdeck]) -> None:
    """One key holds 90% of the jobs, all ahead of the others in claim order
    (a higher priority), and one of them runs: the claim still finds ten
    other keys' jobs, as fast as with a backlog a hundred times smaller."""
    clock = Clock()
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1, "concurrency_key": "payload.c"}})
    _fill(deck, "hot", 900, priority=10)
    for i in range(100):
        _fill(deck, f"a{i:02}", 1, priority=0)
    (hot,) = deck.store.claim("w", clock.now, limit=1)
    assert hot.payload["c"] == "hot"
    small = _timed_claims(deck, clock)
    _fill(deck, "hot", 89_100, priority=10)
    for i in range(100):
        _fill(deck, f"b{i:02}", 99, priority=0)
    if deck.store.dialect == "postgresql":
        with deck.store.write() as conn:
            conn.execute(text("ANALYZE jobs"))
    with deck.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(text("jobs"))).scalar_one() == 100_000
    big = _timed_claims(deck, clock)
    # The fastest of each: what a claim costs with the backlog, without the
    # waits a busy machine adds to some of them (the median of five, on a
    # loaded machine, once read 111 against 26 ms). A claim that walked the
    # hot key's backlog would be slow every time.
    a, b = min(small), min(big)
    print(f"{deck.store.dialect}: claim of 10 with a 900-job hot key {a * 1000:.1f} ms, with 90k {b * 1000:.1f} ms")
    assert b < 3 * a + 0.010


def test_an_edit_of_the_payload_or_queue_recomputes_the_keys(make_deck: Callable[..., Jobdeck]) -> None:
    clock = Clock()
    deck = make_deck(
        clock=clock,
        types={"demo.sleep": {"concurrency": 1, "concurrency_key": "payload.c"}},
        queues={"slow": {"rate": "5/1s", "rate_key": "payload.a"}},
    )
    job, _ = deck.enqueue("demo.sleep", {"c": "x", "a": 1})
    assert (job.rate_key, job.concurrency_key) == (None, '"x"')
    edited = deck.edit(job.id, {"payload": {"c": "y", "a": 2}, "queue": "slow"}).after
    assert (edited.rate_key, edited.concurrency_key) == ("2", '"y"')
    running, _ = deck.enqueue("demo.sleep", {"c": "y"})
    assert [j.id for j in deck.store.claim("w", clock.now, limit=1)] == [job.id]  # first in line
    assert deck.store.claim("w", clock.now, limit=5) == []  # the other "y" waits for the edited one


def test_a_full_types_backlog_at_the_head_does_not_hide_the_rest(make_deck: Callable[..., Jobdeck]) -> None:
    """500 jobs of a type whose rate is used up, ahead of one other job (a
    higher priority): the claim leaves the full type out in SQL and takes the other."""
    clock = Clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"rate": "1/60s"}, "demo.sleep": {"concurrency": 1}})
    deck.store.enqueue_many([NewJob("demo.noop", {"i": i}, priority=10) for i in range(500)], clock.now)
    deck.store.enqueue_many([NewJob("demo.sleep", {"i": i}, priority=5) for i in range(300)], clock.now)
    other, _ = deck.enqueue("demo.fail", {})
    assert [j.type for j in deck.store.claim("w", clock.now, limit=1)] == ["demo.noop"]
    assert [j.type for j in deck.store.claim("w", clock.now, limit=1)] == ["demo.sleep"]
    assert [j.id for j in deck.store.claim("w", clock.now, limit=5)] == [other.id]


def test_a_refill_under_a_key_limit_lands_its_completions_before_the_claim_reads(
    make_deck: Callable[..., Jobdeck],
) -> None:
    """``complete_and_claim`` under a per-key limit (the acker's refill; on
    PostgreSQL its completions go in the flow claim's first pipelined batch):
    a key the completions free is claimed again in the same call, a key
    whose late result is refused stays held, and a workflow job's completion
    (not in the batch's statement: its end moves its dependent) still lands
    and promotes that dependent before the commit."""
    clock = Clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"concurrency": 1, "concurrency_key": "payload.k"}})
    wf = (
        deck.workflow("pair")
        .add("one", "demo.noop", {"k": "w"})
        .add("two", "demo.noop", {"k": "v"}, depends_on=["one"])
    )
    flow = wf.enqueue()
    deck.enqueue_many([{"type": "demo.noop", "payload": {"k": k}} for k in "aabb"])
    first = {j.payload["k"]: j for j in deck.store.claim("w", clock.now, limit=10)}
    assert sorted(first) == ["a", "b", "w"]  # one per key
    a, b, one = first["a"], first["b"], first["w"]
    done = [Outcome(j.id, "w", attempt=j.attempt, started_at=j.claimed_at) for j in (a, one)]
    late = Outcome(b.id, "w", attempt=b.attempt + 1, started_at=clock.now)
    accepted, claimed = deck.store.complete_and_claim([*done, late], "w", clock.now, limit=10)
    assert sorted(accepted) == sorted([a.id, one.id])
    keys = [j.payload["k"] for j in claimed]
    assert "a" in keys and "b" not in keys and "w" not in keys
    assert deck.store.get(b.id).status is State.RUNNING and deck.store.attempts_of(b.id) == []
    assert [(x.attempt, x.outcome) for x in deck.store.attempts_of(one.id)] == [(1, "completed")]
    assert deck.store.get(flow.jobs["two"]).status in (State.PENDING, State.RUNNING)  # promoted
    with deck.store.read() as conn:
        per_key = conn.execute(
            select(jobs.c.concurrency_key, func.count())
            .where(jobs.c.status == State.RUNNING.value)
            .group_by(jobs.c.concurrency_key)
        ).all()
    assert per_key and all(n == 1 for _, n in per_key)
