"""On PostgreSQL every transaction that makes a job claimable now sends the
NOTIFY that wakes the other processes' pools (``jobdeck.worker.listener``): without it a
job made due waits for their next poll."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.worker.listener import Listener, conninfo

from tests.conftest import wait_for
from tests.helpers import statements_sent

pytestmark = [pytest.mark.backends, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


@pytest.fixture
def listener(deck: Jobdeck) -> Iterator[Listener]:
    found = Listener(conninfo(deck.store.engine.url), lambda: None, tick=0.05)
    found.start()
    try:
        wait_for(found.connected.is_set, 10, message="the listener to connect")
        yield found
    finally:
        found.stop()


def _scheduled(deck: Jobdeck) -> int:
    return deck.enqueue("demo.noop", delay_seconds=3600)[0].id


def _dead(deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop", max_retries=0)
    deck.store.claim("w", deck.clock())
    deck.store.fail(job.id, "w", "boom", deck.clock())
    return job.id


def _running(deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop")
    deck.store.claim("w", deck.clock())
    return job.id


MAKE_CLAIMABLE: dict[str, tuple[Callable[[Jobdeck], int], Callable[[Jobdeck, int], Any]]] = {
    "run now": (_scheduled, lambda d, i: d.store.run_now(i, d.clock())),
    "retry": (_dead, lambda d, i: d.store.retry(i, d.clock())),
    "bulk retry": (_dead, lambda d, i: d.store.retry_ids([i], d.clock())),
    "release": (_running, lambda d, i: d.store.release("w", [(i, 1)], d.clock())),
}


@pytest.mark.parametrize("action", list(MAKE_CLAIMABLE))
def test_making_a_job_claimable_notifies_other_processes(deck: Jobdeck, listener: Listener, action: str) -> None:
    prepare, act = MAKE_CLAIMABLE[action]
    job_id = prepare(deck)
    deck.clock.advance(1)  # type: ignore[attr-defined]
    wait_for(lambda: listener.received >= 1, 5, message="the enqueue's own notification")
    before = listener.received
    act(deck, job_id)
    assert deck.store.claim("other", deck.clock() + timedelta(seconds=1), controlled=False)
    wait_for(lambda: listener.received > before, 5, message=f"the NOTIFY of {action}")


ENQUEUES: dict[str, Callable[[Jobdeck], Any]] = {
    "enqueue": lambda d: d.enqueue("demo.noop"),
    "enqueue with a key": lambda d: d.enqueue("demo.noop", idempotency_key="wake-1"),
    "bulk (the deck's plain path)": lambda d: d.enqueue_many([{"type": "demo.noop"}] * 3),
    "bulk with a key": lambda d: d.enqueue_many(
        [{"type": "demo.noop", "idempotency_key": "wake-2"}, {"type": "demo.noop"}]
    ),
    "bulk of checked jobs": lambda d: d.enqueue_many([{"type": "demo.noop", "priority": 1}] * 3),
}


@pytest.mark.parametrize("path", list(ENQUEUES))
def test_every_enqueue_path_notifies_other_processes(deck: Jobdeck, listener: Listener, path: str) -> None:
    """Each enqueue sends its NOTIFY in its own transaction (inside its
    INSERT: ``statements._woke``): the other processes hear of the job as it
    is committed. Other tests on this database notify the same channel, so
    the statements are checked too, not only that something arrived."""
    with statements_sent(deck) as sent:  # a plain single enqueue runs at driver level: recorded too
        ENQUEUES[path](deck)
    assert any("pg_notify" in s or s.startswith("NOTIFY") for s in sent), sent
    wait_for(lambda: listener.received >= 1, 5, message=f"the NOTIFY of {path}")
