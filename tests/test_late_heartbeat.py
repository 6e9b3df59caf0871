"""A worker that notices its own heartbeat landed late says so: a warning in
its log, and its row, which every process's Workers page shows. (A process
starved of CPU, or stuck behind the database, beats late; at stall_timeout
other processes rescue its jobs.)"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from jobdeck.core.clock import since_boot
from jobdeck.runtime import pool_for
from jobdeck.store.models import workers
from jobdeck.worker.pool import WorkerPool
from sqlalchemy import select

pytestmark = pytest.mark.backends


@pytest.fixture
def pool(make_deck: Any) -> WorkerPool:
    """A pool registered but not started: no beat lands but the test's own."""
    deck = make_deck(heartbeat_interval=0.5, stall_timeout=4.0)
    made = pool_for(deck, 1)
    deck.store.register_worker(made.worker_id, "host-a", 4242, 1, deck.clock())
    return made


def _late(pool: WorkerPool) -> tuple[float | None, Any]:
    with pool.store.read() as conn:
        row = conn.execute(
            select(workers.c.late_beat_seconds, workers.c.late_beat_at).where(workers.c.id == pool.worker_id)
        ).one()
    return row.late_beat_seconds, row.late_beat_at


def test_a_beat_on_time_is_not_late(pool: WorkerPool, caplog: pytest.LogCaptureFixture) -> None:
    # Half way from the beat period (0.5 s) to the lease's end (half of stall_timeout, 2 s).
    assert pool.heart.late_beat_after() == 1.25
    with caplog.at_level(logging.WARNING, logger="jobdeck.worker"):
        assert pool.heart.beat_once()
    assert "heartbeat late" not in caplog.text
    assert _late(pool) == (None, None)


def test_a_late_beat_is_logged_and_shown_on_the_workers_page(
    pool: WorkerPool, dash: Any, caplog: pytest.LogCaptureFixture
) -> None:
    before = since_boot()
    pool.lease.renewed = before - 3.0  # the last beat landed 3 s ago: the process was starved
    with caplog.at_level(logging.WARNING, logger="jobdeck.worker"):
        assert pool.heart.beat_once()
    took = since_boot() - before
    seconds, at = _late(pool)
    assert seconds is not None and 3.0 <= seconds <= 3.0 + took and at is not None
    [record] = [r for r in caplog.records if "heartbeat late" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert f"{seconds:.1f} s since the last one landed" in record.getMessage()
    assert "stall_timeout 4 s" in record.getMessage()

    page = dash.get("/workers").get_data(as_text=True)
    assert "Late heartbeat" in page and f"{seconds:.1f} s</span> between beats" in page

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobdeck.worker"):
        assert pool.heart.beat_once()  # on time again: the last late one stays shown
    assert "heartbeat late" not in caplog.text
    assert _late(pool) == (seconds, at)


def _run_loop(pool: WorkerPool, beat: Any, events: list[str]) -> tuple[threading.Thread, threading.Event]:
    """The pool's heartbeat loop on a thread, with ``beat`` as its beat; the
    loop's end goes in ``events``."""
    ended = threading.Event()

    def loop() -> None:
        pool.heart.heartbeat_loop(ended)
        events.append("loop ended")

    pool.heart.beat_once = beat  # type: ignore[method-assign]
    thread = threading.Thread(target=loop, name="test-heartbeat-loop", daemon=True)
    thread.start()
    return thread, ended


def test_the_heartbeat_loop_ends_after_its_beats_in_flight(pool: WorkerPool) -> None:
    """The pool's stop joins this loop before it writes the worker's last
    state: a beat still in flight then would land after it, and its thread
    outlive the stopped pool."""
    started, release = threading.Event(), threading.Event()
    events: list[str] = []

    def slow_beat() -> bool:
        started.set()
        release.wait(10)
        events.append("beat ended")
        return True

    thread, ended = _run_loop(pool, slow_beat, events)
    assert started.wait(10), "no beat started"
    ended.set()
    thread.join(timeout=1.0)  # the loop waits for its beat
    assert thread.is_alive()
    release.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert events[-2:] == ["beat ended", "loop ended"]
    assert not [t for t in threading.enumerate() if t.name == "jobdeck-beat" and t.is_alive()]


def test_a_beat_stuck_past_the_lease_does_not_hold_the_loop(pool: WorkerPool) -> None:
    """A beat stuck on a dead connection holds the loop's end for one lease
    (half of stall_timeout, 2 s here), not for ever."""
    started, release = threading.Event(), threading.Event()
    events: list[str] = []

    def stuck_beat() -> bool:
        started.set()
        release.wait(60)
        return True

    thread, ended = _run_loop(pool, stuck_beat, events)
    try:
        assert started.wait(10), "no beat started"
        ended.set()
        set_at = since_boot()
        thread.join(timeout=30)
        assert not thread.is_alive() and events == ["loop ended"]
        assert since_boot() - set_at >= pool.lease.ttl - 0.5  # it did wait for the beat, up to the lease
    finally:
        release.set()
