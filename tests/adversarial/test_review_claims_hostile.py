"""Hostile tests of the SQLite claim that names the claimable priorities
(``claim_statements.claimable_priorities``, branch p33: bd67b41, ddf81fc).

A due read on SQLite now reads the distinct priorities of the claimable
jobs first and adds ``priority IN (...)``: any claimable due job whose
priority is not in that list is invisible to the claim. These tests look
for ways the list can be incomplete (the per-transaction cache that
``complete_and_claim`` reads before ``before_claim``), pin the edges of
the list (negative, extreme, exactly ``PRIORITY_SPREAD`` and one more),
and check that the cache and the commit watcher's probe leave nothing
behind after an error."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC
from typing import Any

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.store import claim_statements
from jobdeck.store.models import jobs
from jobdeck.store.watch import claimable_due
from sqlalchemy import select

from tests.conftest import Clock

pytestmark = pytest.mark.backends


def _claimable_in_claim_order(deck: Jobdeck) -> list[int]:
    """The claimable jobs due now, in claim order (priority DESC, available_at, id), computed here."""
    c = jobs.c
    now = deck.clock()
    with deck.store.read() as conn:
        rows = conn.execute(select(c.id, c.priority, c.status, c.available_at)).all()
    due = [
        (i, p, at if at.tzinfo else at.replace(tzinfo=UTC))
        for i, p, s, at in rows
        if s in ("pending", "failed") and (at if at.tzinfo else at.replace(tzinfo=UTC)) <= now
    ]
    return [i for i, _, _ in sorted(due, key=lambda r: (-r[1], r[2], r[0]))]


def test_a_job_enqueued_in_before_claim_is_claimed_in_claim_order(make_deck: Callable[..., Jobdeck]) -> None:
    """ATTACK: ``complete_and_claim`` reads the priorities before it calls
    ``before_claim`` and its claim reuses them. A ``before_claim`` that
    enqueues (its write joins the transaction, as the docstring of
    ``complete_and_claim`` promises every store call does) adds a claimable
    due job of a priority the cached list does not hold: the claim must
    still take it first, as it does on PostgreSQL and did before."""
    clock = Clock()
    deck = make_deck(clock=clock)
    low = deck.enqueue("demo.noop", priority=0).job.id
    added: list[int] = []
    _, claimed = deck.store.complete_and_claim(
        [],
        "w",
        clock.now,
        limit=1,
        before_claim=lambda: added.extend(deck.enqueue_many([{"type": "demo.noop", "priority": 9}])),
    )
    assert [j.id for j in claimed] == added, f"claimed {[j.id for j in claimed]}, not the priority-9 job {added}"
    assert low not in [j.id for j in claimed]


def test_a_job_enqueued_in_before_claim_among_none_is_claimed(make_deck: Callable[..., Jobdeck]) -> None:
    """ATTACK: as above, with no claimable job at all when the priorities are
    read: the cached list is ``[]``, which ``claim_in`` takes for "nothing is
    pending" and returns without a statement, though ``before_claim`` made
    a job due in the same transaction."""
    clock = Clock()
    deck = make_deck(clock=clock)
    added: list[int] = []
    _, claimed = deck.store.complete_and_claim(
        [], "w", clock.now, limit=5, before_claim=lambda: added.extend(deck.enqueue_many([{"type": "demo.noop"}]))
    )
    assert [j.id for j in claimed] == added


SPREAD = 32
"""``claim_statements.PRIORITY_SPREAD`` (asserted where it is used)."""


@pytest.mark.parametrize("spread", [SPREAD, SPREAD + 1], ids=["32", "33"])
def test_extreme_and_negative_priorities_at_the_spread_edge_claim_in_order(
    make_deck: Callable[..., Jobdeck], spread: int
) -> None:
    """Exactly ``PRIORITY_SPREAD`` distinct priorities (named) and one more
    (the walk), among them the extremes an enqueue accepts (-1,000,000 and 1,000,000) and negatives,
    each holding a due job, a job due later and a dead job: claims of 3 at a
    time take exactly the due jobs in claim order and never a later or dead one."""
    clock = Clock()
    deck = make_deck(clock=clock)
    priorities = [-1_000_000, 1_000_000, -1, 0, 1] + [p * 7 - 100 for p in range(spread - 5)]
    assert len(set(priorities)) == spread
    later = deck.enqueue_many(
        [{"type": "demo.noop", "priority": p, "delay_seconds": 3600} for p in reversed(priorities)]
    )
    assert later
    deck.enqueue_many([{"type": "demo.noop", "priority": p} for p in priorities])
    if deck.store.sqlite:
        assert claim_statements.PRIORITY_SPREAD == SPREAD
        with deck.store.write() as conn:
            held = deck.store.claimable_priorities(conn)
        assert held == (sorted(priorities, reverse=True) if spread <= claim_statements.PRIORITY_SPREAD else None)
    else:
        with deck.store.write() as conn:
            assert deck.store.claimable_priorities(conn) is None  # PostgreSQL names none
    want = _claimable_in_claim_order(deck)
    assert len(want) == spread
    got: list[int] = []
    for step in range(spread):
        batch = [j.id for j in deck.store.claim(f"w{step}", clock.now, limit=3)]
        if not batch:
            break
        got += batch
    assert got == want


def test_the_cached_priorities_end_with_a_failed_complete_and_claim(make_deck: Callable[..., Jobdeck]) -> None:
    """ATTACK: ``complete_and_claim`` caches the priorities on the thread
    (``_joined.priorities``). After it fails in ``before_claim`` the cache
    must be gone: a later claim on the same thread, after a job of a new
    priority is enqueued, takes that job first."""
    clock = Clock()
    deck = make_deck(clock=clock)
    deck.enqueue("demo.noop", priority=1)

    def boom() -> None:
        raise RuntimeError("before_claim failed")

    with pytest.raises(RuntimeError):
        deck.store.complete_and_claim([], "w", clock.now, limit=1, before_claim=boom)
    assert not isinstance(getattr(deck.store._joined, "priorities", None), list)  # no list left on the thread
    top = deck.enqueue("demo.noop", priority=50).job.id
    _, claimed = deck.store.complete_and_claim([], "w", clock.now, limit=1)
    assert [j.id for j in claimed] == [top]
    assert [j.priority for j in deck.store.claim("w", clock.now, limit=5)] == [1]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_watchers_probe_ends_its_transaction_when_a_read_fails(
    make_deck: Callable[..., Jobdeck], db_url: str
) -> None:
    """ATTACK: the probe is now two reads in one BEGIN/COMMIT on the watcher's
    autocommit connection. A read that raises (here the due read's values,
    which cannot be bound) must not leave the read transaction open (it
    would pin the WAL and hold back every checkpoint), and the next probe
    must work on the same connection."""
    clock = Clock()
    deck = make_deck(clock=clock)
    deck.enqueue("demo.noop", priority=3)
    conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        bad: Any = object()
        with pytest.raises(AttributeError):  # the time cannot be written, after the priority read
            claimable_due(conn, bad, ["demo.noop"], None)
        assert not conn.in_transaction
        assert claimable_due(conn, clock.now, ["demo.noop"], None)
        assert not conn.in_transaction
        deck.enqueue("demo.fail", priority=-7)
        assert claimable_due(conn, clock.now, ["demo.fail"], None)
        assert not claimable_due(conn, clock.now, ["demo.fail"], ["elsewhere"])
        assert not conn.in_transaction
    finally:
        conn.close()
