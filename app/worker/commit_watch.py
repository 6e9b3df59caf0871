"""Cross-process wake-up on SQLite: ``PRAGMA data_version``.

SQLite has no LISTEN/NOTIFY, but ``PRAGMA data_version`` on a connection
changes whenever *another* connection (in this process or any other)
commits to the file, and reading it costs a few microseconds: it looks at
the WAL index in shared memory, it reads no table and takes no lock. Each
process with a worker pool runs one ``CommitWatcher``: a thread with its
own ``sqlite3`` connection (not a checkout from SQLAlchemy's pool per poll)
that reads the pragma and, when it moved, asks on
the same connection whether a job this pool could claim is now due; only
then it wakes the fetcher. So a job enqueued by the ``serve`` process is
claimed by a ``worker`` process within milliseconds instead of at its next
``poll_interval``, and the commits of other processes' acks (which change
the version too) never send this pool into an empty claim that would take
the write lock for nothing. While the pool has no room (``has_room``: a
drain keeps it full), a commit waits to be looked at until it has: the
pool's own acks move the version on every commit, and each read then only
woke a fetcher that could claim nothing (2.5% of a ``jobdeck worker``'s
GIL samples in a profiled drain).

When to read: after a write to the database's files, every ``interval``
(5 ms) until the version moves with no write since (the writes' commit is
visible: it becomes so only after the writer's sync), for at most ``HOT`` (a
couple of seconds, in case the write belonged to no commit) after the last
write; otherwise it sleeps until a write
(``jobdeck.worker.file_changes``, inotify), and reads at least every
``IDLE`` (half a second) even with none.
Read every 5 ms whatever happened, an idle process spent 3 to 4% of a core
on it. Where inotify cannot be had (not Linux, the per-user limit of
instances reached, no file descriptor left) it reads every ``interval``, as
it always did.

Like the PostgreSQL listener (``jobdeck.worker.listener``) it is only an accelerator:
the pool still polls every ``poll_interval``, so if the watcher fails,
jobs still start, just later.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from jobdeck.store import Store
from jobdeck.store.watch import claimable_due, data_version
from jobdeck.worker.file_changes import FileChanges, open_changes

log = logging.getLogger("jobdeck.commit_watch")

HOT = 2.0
"""The longest stretch of reads every ``interval`` after a write to the
database's files with the version still where it was. The commit the write
belongs to becomes visible only after the writer's sync
(``jobdeck.worker.file_changes``), which a loaded disk or a network volume
can hold for hundreds of milliseconds; a write may also belong to no commit
(a checkpoint, a transaction rolled back), and then the reads stop here."""
IDLE = 0.5
"""The longest sleep with no write seen: a bound on how late a commit whose
writes gave no event (a network mount written from another machine) is seen."""


class CommitWatcher:
    """Poll ``PRAGMA data_version`` on one dedicated connection; call
    ``wake`` when another connection committed and a claimable job is due.

    ``checks`` (version changes seen), ``wakes``, ``reads`` (of the pragma)
    and ``sleeping`` are signals tests wait on."""

    def __init__(
        self,
        path: str,
        wake: Callable[[], None],
        *,
        types: Callable[[], Sequence[str]],
        queues: Sequence[str] | None = None,
        clock: Callable[[], datetime],
        interval: float = 0.005,
        idle: float = IDLE,
        has_room: Callable[[], bool] = lambda: True,
    ) -> None:
        self.path = path
        self.wake = wake
        self.has_room = has_room
        """Whether the pool would claim now (``WorkerPool.has_room``)."""
        self.types = types
        self.queues = list(queues) if queues is not None else None
        self.clock = clock
        self.interval = interval
        self.idle = idle
        self.reads = 0
        self.checks = 0
        self.wakes = 0
        self.watching = threading.Event()
        self.sleeping = threading.Event()
        """Set while it sleeps until a write (or ``idle``) with no read due."""
        self._stop = threading.Event()
        self._changes: FileChanges | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="jobdeck-commit-watch", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        self._stop.set()
        changes = self._changes
        if changes is not None:
            changes.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True, timeout=1)
            except sqlite3.Error as exc:
                log.warning("commit watcher cannot open %s (%s); polling only", self.path, exc)
                self._stop.wait(1.0)
                continue
            try:
                self._changes = changes = open_changes(self.path)
            except OSError as exc:
                log.warning("commit watcher cannot watch %s (%s); polling every few milliseconds", self.path, exc)
                self._changes = changes = None
            try:
                self._watch(conn, changes)
            except (sqlite3.Error, OSError) as exc:
                log.warning("commit watcher failed (%s); reopening", exc, exc_info=True)
                self._stop.wait(0.5)
            finally:
                self.watching.clear()
                self._changes = None
                if changes is not None:
                    changes.close()
                conn.close()

    def _watch(self, conn: sqlite3.Connection, changes: FileChanges | None) -> None:
        version = seen = data_version(conn)
        self.watching.set()
        hot_until = 0.0
        while not self._stop.is_set():
            if changes is None or time.monotonic() < hot_until:
                if self._stop.wait(self.interval):
                    break
                written = changes is not None and changes.wait(0)
            else:
                self.sleeping.set()
                written = changes.wait(self.idle)
                self.sleeping.clear()
                if self._stop.is_set():
                    break
            if written:
                hot_until = time.monotonic() + HOT
            self.reads += 1
            now = data_version(conn)
            if now != seen:
                seen = now
                if not written:
                    hot_until = 0.0  # the commit the writes belonged to is visible, and nothing was written since
            if now == version or not self.has_room():
                continue  # a full pool's commits are looked at once it has room: nothing due is missed
            version = now
            self.checks += 1
            if self.due_once(conn):
                self.wakes += 1
                self.wake()

    def due_once(self, conn: sqlite3.Connection, now: datetime | None = None) -> bool:
        """One read on the watcher's connection (autocommit: no lock held
        after it returns): is a job this pool may claim due?"""
        types = list(self.types())
        if not types:
            return False
        return claimable_due(conn, now or self.clock(), types, self.queues)


def watcher_for(
    store: Store,
    wake: Callable[[], None],
    *,
    types: Callable[[], Sequence[str]],
    queues: Sequence[str] | None,
    clock: Callable[[], datetime],
    has_room: Callable[[], bool] = lambda: True,
) -> CommitWatcher | None:
    """The watcher a process runs beside its pool (waking it with ``wake`` for
    a due job of ``types`` in ``queues``); None off SQLite or for an in-memory
    database (no other connection can commit to it)."""
    if store.dialect != "sqlite":
        return None
    path = store.engine.url.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return CommitWatcher(path, wake, types=types, queues=queues, clock=clock, has_room=has_room)
