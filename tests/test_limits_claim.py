"""The queue policy's claim (``controls.claim_due``) with the pool's own
arguments: a pool names the types it serves, so the claim carries the type
list and, once a limited type is full, the list of full types too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.store import Outcome, controls

from tests.conftest import Clock

pytestmark = pytest.mark.backends


@pytest.mark.parametrize("served", [2, 5])
def test_a_full_type_leaves_the_other_types_claimable(make_deck: Callable[..., Jobdeck], served: int) -> None:
    """Regression: with two or more served types and a full type, the
    claim's type list and its full-type list both named their values
    ``type_N``; the statement failed to compile and the pool claimed
    nothing at all until the limited jobs finished."""
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 1}), refresh=0).install()
    types = ["demo.sleep", "demo.noop", "demo.fail", "demo.flaky", "demo.report"][:served]
    first, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    assert [j.id for j in deck.store.claim("w1", clock.now, limit=1, types=types)] == [first.id]
    deck.enqueue("demo.sleep", {"seconds": 60})
    noop, _ = deck.enqueue("demo.noop")
    claimed = deck.store.claim("w2", clock.now, limit=5, types=types)
    assert [j.id for j in claimed] == [noop.id]  # the second sleep waits for the first: the limit is 1


def test_a_claim_over_what_a_limit_leaves_takes_the_picked_jobs_and_leaves_the_rest_pending(
    make_deck: Callable[..., Jobdeck],
) -> None:
    """On SQLite the policy first tries the plain claim and rolls it back if it
    took more of a limited type than is left: the jobs it took back stay
    pending, and the claim is the picked one (the first due in claim order,
    skipping the limited type's jobs past its limit)."""
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 1}), refresh=0).install()
    types = ["demo.sleep", "demo.noop"]
    first, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    noop1, _ = deck.enqueue("demo.noop")
    second, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    noop2, _ = deck.enqueue("demo.noop")
    claimed = deck.store.claim("w1", clock.now, limit=5, types=types)
    assert [j.id for j in claimed] == [first.id, noop1.id, noop2.id]
    assert deck.store.get(second.id).status == "pending"
    assert [j.id for j in deck.store.claim("w2", clock.now, limit=5, types=types)] == []  # the limit is 1


@pytest.mark.parametrize("types", [["demo.sleep", "demo.noop"], None])
def test_a_claim_within_the_limits_takes_the_due_jobs_in_claim_order(
    make_deck: Callable[..., Jobdeck], types: list[str] | None
) -> None:
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 2}), refresh=0).install()
    low, _ = deck.enqueue("demo.noop")
    limited, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    high, _ = deck.enqueue("demo.noop", priority=5)
    claimed = deck.store.claim("w1", clock.now, limit=2, types=types)
    assert [j.id for j in claimed] == [high.id, low.id]
    rest = deck.store.claim("w1", clock.now, limit=5, types=types)
    assert [j.id for j in rest] == [limited.id]


def test_a_type_freed_since_the_last_claim_is_claimed_again_in_claim_order(make_deck: Callable[..., Jobdeck]) -> None:
    """The policy remembers what the last claim found full (PostgreSQL sends
    its plain claim without those types, with the counts); once the limited
    job is done, the next claim reads the type free, and takes its waiting
    job first, in claim order, not only the others."""
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 1}), refresh=0).install()
    types = ["demo.sleep", "demo.noop"]
    deck.enqueue("demo.sleep", {"seconds": 60})
    [held] = deck.store.claim("w1", clock.now, limit=1, types=types)
    second, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    noop1, _ = deck.enqueue("demo.noop")
    assert [j.id for j in deck.store.claim("w1", clock.now, limit=5, types=types)] == [noop1.id]
    assert deck.store.complete_many([Outcome(held.id, "w1", attempt=held.attempt)], clock.now) == [held.id]
    noop2, _ = deck.enqueue("demo.noop")
    assert [j.id for j in deck.store.claim("w1", clock.now, limit=5, types=types)] == [second.id, noop2.id]
    assert deck.store.get(second.id).status == "running"


@pytest.mark.parametrize("limit", ["type", "key"])
def test_a_limited_refill_claims_the_step_its_completion_promoted(
    make_deck: Callable[..., Jobdeck], limit: str
) -> None:
    """A workflow step's completion in the acker's refill promotes the next
    step, and the same transaction's limited claim takes it, under a type's
    concurrency (the queue policy) and under a concurrency of one per key
    (the flow claim). The claim comes after every completion, also where
    PostgreSQL sends the completions and the claim's first reads in one
    batch and the step's completion lands after them."""
    clock = Clock()
    if limit == "type":
        deck = make_deck(clock=clock)
        QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 1}), refresh=0).install()
    else:
        deck = make_deck(clock=clock, types={"demo.noop": {"concurrency": 1, "concurrency_key": "payload.k"}})
    types = ["demo.sleep", "demo.noop"]
    wf = deck.workflow("two").add("a", "demo.noop", {"k": "x"}).add("b", "demo.noop", {"k": "x"}, depends_on=["a"])
    wf = wf.enqueue()
    [a] = deck.store.claim("w1", clock.now, limit=10, types=types)
    assert a.id == wf.jobs["a"]
    done = [Outcome(a.id, "w1", attempt=a.attempt)]
    accepted, refill = deck.store.complete_and_claim(done, "w1", clock.now, limit=10, types=types)
    assert accepted == [a.id]
    assert [j.id for j in refill] == [wf.jobs["b"]]
    assert deck.store.get(a.id).status == "completed"


def test_claims_that_take_no_limited_job_skip_the_counts_and_still_hold_the_limit(
    make_deck: Callable[..., Jobdeck], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite, while the claims take no job of a limited type, the next
    one claims without counting the running jobs (no limit is touched), and
    counts again once a limited job comes due: the limit holds and the order
    is the claim order."""
    counted: list[str] = []
    count = controls._Claim.count

    def counting(claim: Any, conn: Any, column: str, names: list[str]) -> dict[str, int]:
        counted.append(column)
        return count(claim, conn, column, names)

    monkeypatch.setattr(controls._Claim, "count", counting)
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.sleep": 1}), refresh=0).install()
    types = ["demo.sleep", "demo.noop"]

    def claim() -> list[int]:
        return [j.id for j in deck.store.claim("w1", clock.now, limit=5, types=types)]

    for _ in range(3):
        noop, _ = deck.enqueue("demo.noop")
        assert claim() == [noop.id]
    if backend == "sqlite":
        assert len(counted) == 2, counted  # the first claim counted (types, queues); the next two did not
    first, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    noop, _ = deck.enqueue("demo.noop")
    second, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    assert claim() == [first.id, noop.id]
    assert deck.store.get(second.id).status == "pending"
    later, _ = deck.enqueue("demo.noop")
    assert claim() == [later.id]  # the type is full
