"""The queue policy's claim (``controls.claim_due``) with the pool's own
arguments: a pool names the types it serves, so the claim carries the type
list and, once a limited type is full, the list of full types too."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls

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
