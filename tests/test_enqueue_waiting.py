"""Concurrent enqueue answers share one "why is it waiting?" read
(``jobdeck.web.serialize.SharedRead``); an answer alone reads alone, and each
answer judges its job at its own ``now``."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from jobdeck.web.serialize import SharedRead

from tests.conftest import wait_for
from tests.test_waiting import T0, a_job, clear


def test_answers_in_flight_together_share_one_read_each_at_its_own_now() -> None:
    shared = SharedRead()
    reads: list[int] = []
    reading, release = threading.Event(), threading.Event()

    def load():  # type: ignore[no-untyped-def]
        reads.append(1)
        reading.set()
        release.wait(10)
        return clear(now=T0)

    later = T0 + timedelta(seconds=5)
    due_later = a_job(available_at=later)  # due at the follower's now, not at the leader's
    got: dict[str, object] = {}
    leader = threading.Thread(target=lambda: got.update(leader=shared.reasons(load, T0).of(a_job())))
    leader.start()
    assert reading.wait(10), "the leader's read did not start"
    follower = threading.Thread(target=lambda: got.update(follower=shared.reasons(load, later).of(due_later)))
    follower.start()
    flight = shared._flight
    assert flight is not None
    # The follower waits on the leader's read (the Future's condition has a waiter).
    wait_for(lambda: flight._condition._waiters, 5, message="the follower to join the read")  # type: ignore[attr-defined]
    release.set()
    leader.join(10)
    follower.join(10)
    assert len(reads) == 1, "the concurrent answers read once between them"
    assert got == {"leader": None, "follower": None}, "the follower judged its job at the leader's now"


def test_an_answer_alone_reads_alone_every_time() -> None:
    shared = SharedRead()
    reads: list[int] = []

    def load():  # type: ignore[no-untyped-def]
        reads.append(1)
        return clear(paused=frozenset({"reports"}) if len(reads) > 1 else frozenset())

    assert shared.reasons(load, T0).of(a_job()) is None
    assert shared.reasons(load, T0).of(a_job())["code"] == "queue_paused"  # type: ignore[index]
    assert len(reads) == 2, "a finished read is never reused"


def test_a_failed_read_fails_every_answer_that_shared_it_and_the_next_reads_again() -> None:
    shared = SharedRead()
    calls: list[int] = []

    def failing():  # type: ignore[no-untyped-def]
        calls.append(1)
        raise RuntimeError("database is gone")

    with pytest.raises(RuntimeError, match="database is gone"):
        shared.reasons(failing, T0).of(a_job())
    assert shared.reasons(lambda: clear(), T0).of(a_job()) is None
