"""The maintenance reads that used to hold the write lock: the per-minute
roll-up's count of attempts and retention's search for old jobs. Each now
reads first and writes after, so another process (a second engine) gets in
between: it must find the database free to write while they read, and what
it does in between must not be counted twice or deleted by mistake."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.errors import JobNotFound
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.upkeep import Maintenance, Retention
from jobdeck.store import Outcome
from sqlalchemy import event

pytestmark = pytest.mark.backends

COUNTING = "FROM attempts JOIN jobs"
"""The roll-up's count of finished attempts."""
PICKING = "ORDER BY jobs.id"
"""Retention's search for the next batch of old jobs."""


BLOCKED = 10.0
"""Seconds the other process is given; past them it counts as held up."""


@contextmanager
def meanwhile(deck: Jobdeck, marker: str, action: Callable[[], Any]) -> Iterator[list[Any]]:
    """Run ``action`` once, as another process would, right after ``deck``
    executes a statement containing ``marker`` (inside whatever transaction
    that statement is in), and wait for it up to ``BLOCKED`` seconds. Yields
    the list its result goes to; an action that failed or was held up
    leaves it empty and fails the test at the end of the block."""
    done: list[Any] = []
    errors: list[BaseException] = []
    started: list[threading.Thread] = []

    def act() -> None:
        try:
            done.append(action())
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if marker in statement and not started:
            started.append(threading.Thread(target=act, daemon=True))
            started[0].start()
            started[0].join(BLOCKED)

    event.listen(deck.store.engine, "after_cursor_execute", after)
    try:
        yield done
    finally:
        event.remove(deck.store.engine, "after_cursor_execute", after)
    assert started, f"no statement with {marker!r} ran"
    started[0].join(BLOCKED)
    assert not errors, f"the other process failed meanwhile: {errors[0]!r}"
    assert done, f"the other process was held up for {BLOCKED} s"


def finish(deck: Jobdeck, now: Any, job_id: int) -> None:
    with deck.store.write() as conn:
        [j] = deck.store.claim_ids(conn, "w", now, [job_id])
    deck.store.complete_many([Outcome(job_id, "w", attempt=j.attempt, started_at=now)], now)


def completed_in(m: Maintenance, minute: Any) -> int:
    rows = {(r["type"], r["minute"]): r for r in m.stats(minute - timedelta(hours=2))}
    return int(rows.get(("demo.noop", minute), {"completed": 0})["completed"])


def test_a_roll_up_counts_without_holding_other_processes_writes(deck, make_deck, clock) -> None:
    other = make_deck(clock=clock, sqlite_busy_timeout=0.2)
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    m.rollup_once(clock.now)  # sets the watermark
    for _ in range(3):
        finish(deck, clock.now, deck.enqueue("demo.noop")[0].id)
    minute = clock.now.replace(second=0, microsecond=0)
    with meanwhile(deck, COUNTING, lambda: other.enqueue("demo.noop")[0].id):
        assert m.rollup_once(clock.advance(120)) > 0
    assert completed_in(m, minute) == 3


def test_two_roll_ups_of_the_same_minutes_add_them_once(deck, make_deck, clock) -> None:
    second = make_deck(clock=clock)
    other = Maintenance(second.store, second.clock, second.config.stall_timeout)
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    m.rollup_once(clock.now)
    for _ in range(3):
        finish(deck, clock.now, deck.enqueue("demo.noop")[0].id)
    minute = clock.now.replace(second=0, microsecond=0)
    later = clock.advance(120)
    # The other process counts the same minutes, and writes first.
    with meanwhile(deck, COUNTING, lambda: other.rollup_once(later)) as closed:
        assert m.rollup_once(later) == 0  # its watermark moved meanwhile: nothing of ours is added
    assert closed[0] > 0  # the other one closed the minutes
    assert completed_in(m, minute) == 3
    assert m.rollup_once(later) == 0


def test_retention_finds_old_jobs_without_holding_other_processes_writes(deck, make_deck, clock) -> None:
    other = make_deck(clock=clock, sqlite_busy_timeout=0.2)
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout, Retention(completed_days=7))
    old = deck.enqueue("demo.noop")[0].id
    finish(deck, clock.now, old)
    with meanwhile(deck, PICKING, lambda: other.enqueue("demo.noop")[0].id) as enqueued:
        assert m.prune_once(clock.advance(8 * 86400))["jobs"] == 1
    assert deck.store.get(enqueued[0]).status is State.PENDING


def test_retention_keeps_a_job_that_finished_again_after_it_was_picked(deck, make_deck, clock) -> None:
    other = make_deck(clock=clock)
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout, Retention(completed_days=7, batch=10))
    kept = deck.enqueue("demo.noop")[0].id
    deck.store.discard(kept, clock.now)
    gone = deck.enqueue("demo.noop")[0].id
    finish(deck, clock.now, gone)
    now = clock.advance(8 * 86400)

    def run_it_again() -> None:  # an operator retries it and it completes, on another host
        other.store.retry(kept, now)
        finish(other, now, kept)

    with meanwhile(deck, PICKING, run_it_again):
        assert m.prune_once(now)["jobs"] == 1
    assert deck.store.get(kept).status is State.COMPLETED
    assert len(deck.store.attempts_of(kept)) == 1
    with pytest.raises(JobNotFound):
        deck.store.get(gone)
