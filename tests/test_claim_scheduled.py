"""Claims among jobs scheduled for later.

The claim index orders each priority's claimable jobs by ``available_at``:
its due jobs first, then those scheduled for later. A claim that found
fewer due jobs than its limit used to walk on through every scheduled job
of the index; on SQLite the due reads now name the priorities held
(``claim_statements.claimable_priorities``) and stop where each one's
scheduled jobs begin. These tests pin the order the claims keep (against
the order computed here, on both databases) and, on SQLite, that the work
of a claim and of the commit watcher's probe does not grow with the
scheduled jobs (SQLite's own count of the virtual machine's steps)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from typing import Any

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.store import claim_statements
from jobdeck.store.claim import Claiming
from jobdeck.store.models import jobs
from jobdeck.store.watch import claimable_due
from sqlalchemy import event, select

from tests.conftest import Clock

pytestmark = pytest.mark.backends

TYPES = ["demo.noop", "demo.fail"]


def _fill(deck: Jobdeck, rng: random.Random, n: int, priorities: list[int], later: float) -> None:
    """``n`` jobs of random priorities, types and delays: about a third due
    now, the rest due within ``later`` seconds."""
    items = [
        {
            "type": rng.choice(TYPES),
            "priority": rng.choice(priorities),
            "delay_seconds": 0 if rng.random() < 0.33 else rng.randint(1, int(later)),
        }
        for _ in range(n)
    ]
    deck.enqueue_many(items)


def _all(deck: Jobdeck) -> list[Any]:
    """Every job's id, type, priority, status and ``available_at`` (aware, UTC)."""
    c = jobs.c
    with deck.store.read() as conn:
        rows = conn.execute(select(c.id, c.type, c.priority, c.status, c.available_at)).all()
    return [(i, t, p, s, at if at.tzinfo else at.replace(tzinfo=UTC)) for i, t, p, s, at in rows]


def _expected(deck: Jobdeck, types: list[str] | None = None) -> list[int]:
    """The claimable jobs due now, in claim order (priority DESC, available_at, id), computed here."""
    now = deck.clock()
    due = [r for r in _all(deck) if r[3] in ("pending", "failed") and r[4] <= now and (types is None or r[1] in types)]
    return [r[0] for r in sorted(due, key=lambda r: (-r[2], r[4], r[0]))]


@pytest.mark.parametrize("spread", [3, 40], ids=["few priorities", "more than PRIORITY_SPREAD"])
def test_claims_take_the_due_jobs_in_claim_order_among_scheduled_ones(
    make_deck: Callable[..., Jobdeck], spread: int
) -> None:
    """Claims of a few jobs at a time, the clock moving on between them, take
    exactly the due jobs in claim order, whatever is scheduled around them;
    with more priorities than a due read names (``PRIORITY_SPREAD``) too."""
    assert spread <= 3 or spread > claim_statements.PRIORITY_SPREAD
    clock = Clock()
    deck = make_deck(clock=clock)
    rng = random.Random(spread)
    priorities = rng.sample(range(-1_000_000, 1_000_001), spread)
    _fill(deck, rng, 600, priorities, later=100)
    claimed: list[int] = []
    for step in range(40):
        types = TYPES[:1] if step % 3 == 0 else None
        want = _expected(deck, types)[:7]
        got = [j.id for j in deck.store.claim(f"w{step}", clock.now, limit=7, types=types)]
        assert got == want, f"step {step}: claimed {got}, the due jobs in claim order are {want}"
        claimed += got
        clock.advance(3)
    assert len(claimed) == len(set(claimed)) > 150


def test_a_limited_claim_among_scheduled_jobs_keeps_the_limit_and_the_order(make_deck: Callable[..., Jobdeck]) -> None:
    """The limit-aware claim reads its picks the same way: with a concurrency
    limit of 2 on one type and jobs scheduled in every priority, each claim
    takes the due jobs in claim order, skipping the limited type's once two
    of them run."""
    clock = Clock()
    deck = make_deck(clock=clock)
    QueueControls(deck.store, Limits(queues={}, types={"demo.fail": 2}), refresh=0).install()
    rng = random.Random(7)
    _fill(deck, rng, 300, [-5, 0, 5, 10], later=50)
    running = 0
    for step in range(15):
        due = _expected(deck)
        want: list[int] = []
        limited = running
        type_of = {r[0]: r[1] for r in _all(deck)}
        for job_id in due:
            if type_of[job_id] == "demo.fail":
                if limited >= 2:
                    continue
                limited += 1
            want.append(job_id)
            if len(want) == 5:
                break
        got = deck.store.claim(f"w{step}", clock.now, limit=5, types=TYPES)
        assert [j.id for j in got] == want, f"step {step}"
        running += sum(j.type == "demo.fail" for j in got)
        clock.advance(2)


@contextmanager
def _steps(deck: Jobdeck) -> Iterator[list[int]]:
    """SQLite's virtual machine steps (in thousands) the store's connections
    run while the block runs: the work a statement does, counted by SQLite,
    whatever the machine's speed."""
    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0

    def on_checkout(dbapi_conn: Any, *_: Any) -> None:
        dbapi_conn.set_progress_handler(count, 1000)

    event.listen(deck.store.engine, "checkout", on_checkout)
    try:
        yield counted
    finally:
        event.remove(deck.store.engine, "checkout", on_checkout)


def _claim_steps(deck: Jobdeck, clock: Clock) -> int:
    with _steps(deck) as counted:
        assert len(deck.store.claim("w", clock.now, limit=250)) == 5
    return counted[0]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_claims_work_does_not_grow_with_the_jobs_scheduled_for_later(
    make_deck: Callable[..., Jobdeck], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim of the 5 due jobs beside 20,000 jobs due in an hour runs about
    as many SQLite steps as beside none. Without the priorities named (the
    walk of the claim index, switched back on here) it runs more than ten
    times as many, one per scheduled job and more."""
    clock = Clock()
    deck = make_deck(clock=clock)
    due = [{"type": "demo.noop", "priority": p} for p in (0, 0, 3, -2, 3)]
    deck.enqueue_many(due)
    alone = _claim_steps(deck, clock)
    for _ in range(4):
        deck.enqueue_many(
            [{"type": "demo.noop", "priority": (0, 3, -2)[i % 3], "delay_seconds": 3600} for i in range(5_000)]
        )
    deck.enqueue_many(due)
    beside = _claim_steps(deck, clock)
    assert beside <= alone * 2 + 5, f"{beside}k steps beside the scheduled jobs, {alone}k beside none"
    deck.enqueue_many(due)
    monkeypatch.setattr(Claiming, "claimable_priorities", lambda self, conn: None)
    walked = _claim_steps(deck, clock)
    assert walked > 10 * beside, f"the walk of the index: {walked}k steps, the named priorities' {beside}k"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_commit_watchers_probe_among_scheduled_jobs(make_deck: Callable[..., Jobdeck], db_url: str) -> None:
    """The commit watcher's probe (``claimable_due``) says no while every job
    is scheduled for later and yes once one is due, in about the same
    number of SQLite steps either way, and leaves no transaction open."""
    clock = Clock()
    deck = make_deck(clock=clock)
    for _ in range(4):
        deck.enqueue_many([{"type": "demo.noop", "priority": i % 4, "delay_seconds": 3600} for i in range(5_000)])
    conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        counted = [0]

        def count() -> int:
            counted[0] += 1
            return 0

        conn.set_progress_handler(count, 1000)
        assert not claimable_due(conn, clock.now, TYPES, None)
        assert not conn.in_transaction
        assert counted[0] <= 5, f"{counted[0]}k steps for a probe that found nothing due"
        assert claimable_due(conn, clock.now + timedelta(hours=2), TYPES, None)
        assert not claimable_due(conn, clock.now + timedelta(hours=2), ["demo.fail"], None)
        deck.enqueue("demo.fail")
        assert claimable_due(conn, clock.now, TYPES, None)
        assert claimable_due(conn, clock.now, ["demo.fail"], ["default"])
        assert not claimable_due(conn, clock.now, ["demo.fail"], ["elsewhere"])
        assert not conn.in_transaction
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_queue_latency_read_among_scheduled_jobs(make_deck: Callable[..., Jobdeck]) -> None:
    """The overview's queue latency (how long the next claimable job has been
    due) reads no scheduled job: None while every job is scheduled for later,
    the due job's age once one is due, in about as many SQLite steps as
    beside no scheduled job."""
    from jobdeck.store.overview import queue_latency

    clock = Clock()
    deck = make_deck(clock=clock)
    for _ in range(4):
        deck.enqueue_many([{"type": "demo.noop", "priority": i % 4, "delay_seconds": 3600} for i in range(5_000)])
    with _steps(deck) as counted:
        assert queue_latency(deck.store, clock.now) is None
    assert counted[0] <= 5, f"{counted[0]}k steps for a latency with nothing due"
    deck.enqueue("demo.fail", priority=-3)
    clock.advance(7)
    with _steps(deck) as counted:
        assert queue_latency(deck.store, clock.now) == pytest.approx(7.0)
    assert counted[0] <= 5, f"{counted[0]}k steps for a latency with one job due"
