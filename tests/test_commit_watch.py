"""SQLite cross-process wake-up: PRAGMA data_version (jobdeck.worker.commit_watch)."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import threading
import time
from datetime import timedelta

from jobdeck.core.states import State
from jobdeck.runtime import Runtime
from jobdeck.worker import commit_watch, file_changes
from jobdeck.worker.commit_watch import CommitWatcher
from jobdeck.worker.file_changes import open_changes

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


def _watcher(deck, woken: list[int], **kwargs) -> CommitWatcher:
    return CommitWatcher(deck.store.engine.url.database, lambda: woken.append(1), types=lambda: ["demo.noop"],
                         clock=deck.clock, **kwargs)  # fmt: skip


def test_an_idle_watcher_sleeps_until_a_commit_writes_the_file(make_deck):
    """Between writes the watcher reads nothing: it sleeps on the folder's
    inotify events. With ``idle`` at a minute, only a write's event can make
    it read, so a prompt wake shows the event woke it; and its reads stop
    while nothing is written (``sleeping``), where it used to read the
    pragma every 5 ms (3 to 4% of a core in an idle process)."""
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    watcher = _watcher(deck, woken, idle=60.0)
    watcher.start()
    try:
        wait_for(watcher.sleeping.is_set, 5, message="the watcher to sleep with nothing written")
        reads = watcher.reads
        other.enqueue("demo.noop")
        wait_for(lambda: woken, 5, message="a commit's write to wake the watcher")
        assert watcher.reads > reads
        wait_for(watcher.sleeping.is_set, 5, message="the watcher to sleep again once the writes stopped")
    finally:
        watcher.stop()


def test_a_sleeping_watcher_stops_at_once(make_deck):
    """``stop`` interrupts the sleep: it does not wait out ``idle``."""
    deck = make_deck()
    watcher = _watcher(deck, [], idle=60.0)
    watcher.start()
    wait_for(watcher.sleeping.is_set, 5, message="the watcher to sleep")
    watcher.stop()  # joins the thread for at most 5 s
    assert watcher._thread is not None and not watcher._thread.is_alive(), "stop waited for the sleep to end"


def test_without_inotify_the_watcher_reads_every_interval(make_deck, monkeypatch):
    """Where inotify cannot be had (not Linux, or the per-user limit of
    instances reached) the watcher polls as it always did: a commit still
    wakes the pool promptly, with ``idle`` at a minute."""
    monkeypatch.setattr(commit_watch, "open_changes", lambda path: None)
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    watcher = _watcher(deck, woken, idle=60.0)
    watcher.start()
    try:
        wait_for(watcher.watching.is_set, 5, message="the watcher to start")
        other.enqueue("demo.noop")
        wait_for(lambda: woken, 5, message="the polling watcher to wake the pool")
        assert not watcher.sleeping.is_set()
    finally:
        watcher.stop()


class _Changes:
    """File changes in which the test says when a commit's pages were
    written (``write``, one event); the commit may become visible later,
    after the writer's sync, which gives no event (an fsync, and the WAL
    index in shared memory, make none). Never written to, every wait runs
    out, as on a network mount written from another machine."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._written = False

    def write(self) -> None:
        self._written = True
        self._event.set()

    def wait(self, timeout: float) -> bool:
        self._event.wait(timeout)
        self._event.clear()
        written, self._written = self._written, False
        return written

    def interrupt(self) -> None:
        self._event.set()

    def close(self) -> None:
        pass


def test_a_commit_that_gives_no_event_is_still_seen_within_idle(make_deck, monkeypatch):
    """A folder on a network mount written from another machine gives no
    event: every wait runs out, and the read after ``idle`` sees the commit."""
    monkeypatch.setattr(commit_watch, "open_changes", lambda path: _Changes())
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    watcher = _watcher(deck, woken, idle=0.2)
    watcher.start()
    try:
        wait_for(watcher.sleeping.is_set, 5, message="the watcher to sleep")
        other.enqueue("demo.noop")
        wait_for(lambda: woken, 5, message="the watcher's read after idle to see the commit")
    finally:
        watcher.stop()


def test_file_changes_report_the_databases_files_only(tmp_path):
    """A write to the database, its ``-wal`` or its ``-journal`` is reported;
    one to another file of the folder is not; an interrupted wait returns at
    once; a renamed folder is still watched; a removed one makes every wait
    report (the caller reads)."""
    folder = tmp_path / "db"
    folder.mkdir()
    changes = open_changes(str(folder / "jobdeck.db"))
    assert changes is not None
    try:
        (folder / "jobdeck.log").write_text("not the database")
        assert changes.wait(0.2) is False
        for name in ("jobdeck.db", "jobdeck.db-wal", "jobdeck.db-journal"):
            (folder / name).write_bytes(b"page")
            assert changes.wait(5) is True, name
        changes.interrupt()
        started = time.monotonic()
        assert changes.wait(60) is False
        assert time.monotonic() - started < 30
        moved = tmp_path / "moved"
        folder.rename(moved)  # inotify follows the folder, and the files keep their names
        assert changes.wait(0.2) is False
        assert not changes.gone
        (moved / "jobdeck.db-wal").write_bytes(b"page")
        assert changes.wait(5) is True
        shutil.rmtree(moved)
        assert changes.wait(5) is True
        assert changes.gone
    finally:
        changes.close()
    changes.close()
    changes.interrupt()  # after the close: nothing is written to a number another file may hold now


def test_file_changes_follow_a_symlinked_database(tmp_path):
    """SQLite may write the ``-wal`` beside the link or beside its target: both folders are watched."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "data.db").write_bytes(b"")
    link_folder = tmp_path / "link"
    link_folder.mkdir()
    (link_folder / "jobdeck.db").symlink_to(real / "data.db")
    changes = open_changes(str(link_folder / "jobdeck.db"))
    assert changes is not None
    try:
        (real / "data.db-wal").write_bytes(b"page")
        assert changes.wait(5) is True
        (link_folder / "jobdeck.db-wal").write_bytes(b"page")
        assert changes.wait(5) is True
    finally:
        changes.close()


class _RefusingLibc:
    """A libc whose ``inotify_init1`` fails, as at the per-user limit of instances (EMFILE)."""

    def inotify_init1(self, flags: int) -> int:
        return -1


def test_no_inotify_instance_means_polling_and_a_line_in_the_log(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(file_changes, "_lib", lambda: _RefusingLibc())
    with caplog.at_level("INFO", logger="jobdeck.commit_watch"):
        assert open_changes(str(tmp_path / "jobdeck.db")) is None
    assert "polling every few milliseconds" in caplog.text


def test_a_commit_visible_long_after_its_write_still_wakes_the_pool_promptly(make_deck, monkeypatch):
    """With ``synchronous=FULL`` a commit writes its pages (the event),
    syncs, then becomes visible (no event). A slow disk holds the sync for
    hundreds of milliseconds: the watcher keeps reading every ``interval``
    until the version moves (for up to ``HOT``), instead of going back to
    sleep and seeing the commit only at its ``idle`` read (5 s here; a
    first version stopped reading 0.25 s after the write)."""
    changes = _Changes()
    monkeypatch.setattr(commit_watch, "open_changes", lambda path: changes)
    deck = make_deck()
    other = make_deck()
    woken: list[float] = []
    watcher = CommitWatcher(deck.store.engine.url.database, lambda: woken.append(time.monotonic()),
                            types=lambda: ["demo.noop"], clock=deck.clock, idle=5.0)  # fmt: skip
    watcher.start()
    try:
        wait_for(watcher.sleeping.is_set, 5, message="the watcher to sleep")
        changes.write()  # the enqueue's pages reach the -wal ...
        time.sleep(0.6)  # ... the disk holds the writer's sync (the scenario, not a wait for something) ...
        other.enqueue("demo.noop")  # ... and the commit becomes visible
        visible = time.monotonic()
        wait_for(lambda: woken, 10, message="the watcher to wake the pool")
        assert woken[0] - visible < 2.0, f"seen {woken[0] - visible:.2f} s after the commit became visible"
    finally:
        watcher.stop()


def test_no_file_descriptor_for_the_watch_means_polling_not_a_dead_watcher(make_deck, monkeypatch):
    """Out of file descriptors for a moment (EMFILE) as the watcher opens its
    watch: it polls instead (a first version's thread died of the OSError,
    and the pool was never woken again)."""
    real_pipe = os.pipe
    failed: list[int] = []

    def pipe_once_short() -> tuple[int, int]:
        if not failed and threading.current_thread().name == "jobdeck-commit-watch":
            failed.append(1)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_pipe()

    monkeypatch.setattr(file_changes.os, "pipe", pipe_once_short)
    deck = make_deck()
    other = make_deck()
    woken: list[int] = []
    watcher = _watcher(deck, woken, idle=60.0)
    watcher.start()
    try:
        wait_for(watcher.watching.is_set, 5, message="the watcher to start")  # after its first read
        assert failed, "the watcher did not try its pipe"
        other.enqueue("demo.noop")
        wait_for(lambda: woken, 5, message="the watcher to wake the pool after the EMFILE")
        assert watcher._thread is not None and watcher._thread.is_alive()
    finally:
        watcher.stop()
