"""Held workflows that nothing can move on, on SQLite and PostgreSQL: the
corners the random graphs (``test_workflow_graphs``) ended in, pinned down.

``hold`` keeps a dependent blocked "until a person retries the
dependency". A cancelled dependency can never be retried (``State.CANCELLED``:
"never claimed, never retried"; ``retry_workflow`` leaves it too), so it
cancels its dependents even when they hold: before, they waited for
something that could not happen. And a workflow whose only jobs left are
blocked reads ``held``, not ``running``."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome

pytestmark = pytest.mark.backends


def _run(deck: Jobdeck, *, fail: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Claim and finish what is due until nothing is; the steps in ``fail`` fail for good."""
    ran: list[str] = []
    while claimed := deck.store.claim("w1", deck.clock(), limit=10):
        ran.extend(j.step or "" for j in claimed)
        now = deck.clock()
        deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in claimed if j.step not in fail], now)
        deck.store.fail_many(
            [Outcome(j.id, "w1", attempt=j.attempt, error="boom", retryable=False) for j in claimed if j.step in fail],
            now,
        )
    return ran


def _chain(deck: Jobdeck) -> Any:
    """a -> b -> c, where only c holds."""
    return (
        deck.workflow("chain")
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .add("c", "demo.noop", depends_on=["b"], on_dependency_failure="hold")
        .enqueue()
    )


@pytest.mark.parametrize("cancelled_by", ["the graph", "a person"])
def test_a_held_dependent_of_a_cancelled_dependency_is_not_left_blocked_forever(
    deck: Jobdeck, cancelled_by: str
) -> None:
    wf = _chain(deck)
    if cancelled_by == "the graph":
        _run(deck, fail={"a"})  # a dead: b (cancel) cancelled, c (hold) blocked
        assert deck.store.retry_workflow(wf.id, deck.clock()) == [wf.jobs["a"]]
        assert _run(deck) == ["a"]
    else:
        deck.store.cancel(wf.jobs["b"], deck.clock())  # while blocked
        assert _run(deck) == ["a"]
    assert deck.store.get(wf.jobs["b"]).status is State.CANCELLED
    assert deck.store.retry_workflow(wf.id, deck.clock()) == [], "nothing is left that a person can retry"
    assert deck.store.claim("w1", deck.clock(), limit=10) == []
    c = deck.store.get(wf.jobs["c"])
    assert c.status is not State.BLOCKED, f"c waits, blocked ({c.deps_left} left), for a retry that cannot happen"


@pytest.mark.parametrize("end", ["cancelled", "discarded"])
def test_a_workflow_held_behind_a_dependency_that_will_not_run_is_not_running(deck: Jobdeck, end: str) -> None:
    wf = (
        deck.workflow("pair", on_dependency_failure="hold")
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .enqueue()
    )
    if end == "cancelled":
        deck.store.cancel(wf.jobs["a"], deck.clock())
        assert deck.store.get(wf.jobs["b"]).status is State.CANCELLED  # it cannot wait for a cancelled job
        assert deck.store.workflow(wf.id).workflow.state == "cancelled"
        return
    _run(deck, fail={"a"})
    assert deck.store.workflow(wf.id).workflow.state == "held"
    deck.store.discard(wf.jobs["a"], deck.clock())
    assert deck.store.get(wf.jobs["b"]).status is State.BLOCKED
    assert deck.store.claim("w1", deck.clock(), limit=10) == [], "nothing can run"
    assert deck.store.workflow(wf.id).workflow.state != "running"
