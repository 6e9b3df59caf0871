"""The events the store emits instead of calling up into the worker
(``jobdeck.core.wakeups``), and the pool's subscription to them."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from jobdeck.core.wakeups import Event
from jobdeck.deck import Jobdeck
from jobdeck.runtime import pool_for

from tests.conftest import wait_for


def test_an_event_calls_its_listeners_in_order_until_they_unsubscribe() -> None:
    heard: list[tuple[str, int]] = []
    event: Event[[int]] = Event()
    first, second = (lambda n: heard.append(("first", n))), (lambda n: heard.append(("second", n)))
    event.subscribe(first)
    event.subscribe(second)
    event.emit(1)
    event.unsubscribe(first)
    event.unsubscribe(first)  # twice, or never subscribed: nothing
    event.emit(2)
    assert heard == [("first", 1), ("second", 1), ("second", 2)]
    assert event.listeners == (second,)


def test_a_listener_that_unsubscribes_while_called_does_not_skip_the_next() -> None:
    heard: list[str] = []
    event: Event[[]] = Event()

    def once() -> None:
        heard.append("once")
        event.unsubscribe(once)

    event.subscribe(once)
    event.subscribe(lambda: heard.append("always"))
    event.emit()
    event.emit()
    assert heard == ["once", "always", "always"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_pool_listens_to_the_store_only_while_it_runs(live_deck: Jobdeck, backend: str) -> None:
    """An enqueue in this process reaches the pool through the store's
    ``claimable`` event (no poll: poll_interval is a minute); a stopped pool
    is no longer called."""
    pool = pool_for(live_deck, 1, poll_interval=60)
    assert pool.wake not in live_deck.store.claimable.listeners
    pool.start()
    try:
        assert pool.wake in live_deck.store.claimable.listeners
        wait_for(lambda: pool.inflight == 0)
        job, _ = live_deck.enqueue("demo.noop")
        wait_for(lambda: live_deck.store.get(job.id).status is State.COMPLETED, timeout=5, message="woken claim")
    finally:
        pool.stop(grace=1)
    assert pool.wake not in live_deck.store.claimable.listeners
