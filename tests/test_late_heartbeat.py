"""A worker that notices its own heartbeat landed late says so: a warning in
its log, and its row, which every process's Workers page shows. (A process
starved of CPU, or stuck behind the database, beats late; at stall_timeout
other processes rescue its jobs.)"""

from __future__ import annotations

import logging
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
