"""SQLite cross-process wake-up: PRAGMA data_version (jobdeck.worker.commit_watch)."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta

from jobdeck.core.states import State
from jobdeck.runtime import Runtime
from jobdeck.worker.commit_watch import CommitWatcher

from tests.conftest import wait_for
from tests.helpers import STARVED_SAID


def test_a_job_enqueued_through_another_engine_starts_without_waiting_for_the_poll(make_deck, caplog):
    """Two decks on one file stand for two processes: with a 30 s poll
    interval only the watcher can start the job promptly. A pool starved of
    CPU claims nothing while its lease is lost: such a slow start is excused
    only where the pool said so (seen at a low priority beside a full run:
    5.6 s, its heartbeat 5.1 s late)."""
    producer = make_deck()
    consumer = make_deck(workers=2, poll_interval=30.0)
    runtime = Runtime(consumer, services=False)
    watcher = next(s for s in runtime.services if isinstance(s, CommitWatcher))
    runtime.start()
    try:
        wait_for(watcher.watching.is_set, 5, message="the watcher to open its connection")

        def run_one(timed: bool) -> None:
            caplog.clear()
            job, _ = producer.enqueue("demo.noop")
            started = time.monotonic()
            wait_for(lambda: producer.store.get(job.id).status is State.COMPLETED, 10,
                     message=f"job {job.id} to complete")  # fmt: skip
            took = time.monotonic() - started
            starved = any(s in r.getMessage() for r in caplog.records for s in STARVED_SAID)
            if timed:
                assert took < 3.0 or starved, f"started by the 30 s poll, not by the watcher ({took:.1f} s)"

        run_one(timed=False)  # the pool's start-up claim may take this one
        before = watcher.wakes
        for _ in range(3):
            run_one(timed=True)
        assert watcher.wakes > before
    finally:
        runtime.stop(grace=5)


def test_only_a_claimable_due_job_wakes_the_pool(make_deck):
    """Commits that leave nothing to claim (another pool's acks, a scheduled
    job, a type this pool does not run, a queue it does not serve) are seen
    but do not wake the pool into an empty claim."""
    deck = make_deck()
    woken: list[int] = []
    path = deck.store.engine.url.database
    watcher = CommitWatcher(path, lambda: woken.append(1), types=lambda: ["demo.noop"], queues=["default"],
                            clock=deck.clock)  # fmt: skip
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert not watcher.due_once(conn)
        deck.enqueue("demo.noop", delay_seconds=60)  # scheduled: not due yet
        deck.enqueue("demo.report", {"name": "x"})  # a type this pool does not run
        deck.enqueue("demo.noop", queue="reports")  # a queue this pool does not serve
        assert not watcher.due_once(conn)
        assert watcher.due_once(conn, deck.clock() + timedelta(seconds=61))
        deck.enqueue("demo.noop")
        assert watcher.due_once(conn)
    finally:
        conn.close()


def test_the_watcher_counts_version_changes_and_wakes_only_when_due(make_deck):
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    watcher = CommitWatcher(deck.store.engine.url.database, lambda: woken.append(1), types=lambda: ["demo.noop"],
                            clock=deck.clock, interval=0.002)  # fmt: skip
    watcher.start()
    try:
        wait_for(watcher.watching.is_set, 5, message="the watcher to start")
        other.enqueue("demo.noop", delay_seconds=3600)
        wait_for(lambda: watcher.checks >= 1, 5, message="the watcher to see the commit")
        assert woken == []
        other.enqueue("demo.noop")
        wait_for(lambda: woken, 5, message="the watcher to wake the pool")
    finally:
        watcher.stop()


def test_a_full_pool_has_a_commit_looked_at_once_it_has_room(make_deck):
    """While the pool has no room the watcher reads nothing on a commit (its
    own acks' commits would only wake a fetcher that can claim nothing); the
    commit is looked at, and the pool woken, as soon as it has room."""
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    room = False
    asked = 0

    def has_room() -> bool:
        nonlocal asked
        asked += 1
        return room

    watcher = CommitWatcher(deck.store.engine.url.database, lambda: woken.append(1), types=lambda: ["demo.noop"],
                            clock=deck.clock, interval=0.002, has_room=has_room)  # fmt: skip
    watcher.start()
    try:
        wait_for(watcher.watching.is_set, 5, message="the watcher to start")
        other.enqueue("demo.noop")
        seen = asked
        wait_for(lambda: asked >= seen + 5, 5, message="the watcher to poll while the pool is full")
        assert watcher.checks == 0 and woken == []
        room = True
        wait_for(lambda: woken, 5, message="the watcher to wake the pool once it has room")
        assert watcher.checks == 1
    finally:
        watcher.stop()
