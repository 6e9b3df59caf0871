"""A slow disk against the SQLite commit watcher (``jobdeck.worker.commit_watch``).

A commit with ``synchronous=FULL`` writes its pages to the ``-wal`` (an
inotify event), syncs the file, and only then becomes visible; the sync
gives no event. Here a real writer process has its ``fsync`` and
``fdatasync`` held for 0.6 s each by strace, as a loaded disk or a
network volume holds them, and the watcher, in this process, must still see
the commit within moments of it becoming visible. A first version of the
inotify watcher stopped reading a quarter of a second after the last write
and saw such a commit only at its next idle read (here set to 5 s to make
the difference plain; it is half a second in a deployment).

strace is part of this machine kind; the test fails, never skips, without it.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from jobdeck.worker.commit_watch import CommitWatcher

from tests.conftest import wait_for

pytestmark = pytest.mark.slow

SYNC_DELAY_US = 600_000
"""How long each of the writer's syncs is held (strace's ``delay_exit``, µs)."""

WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA synchronous=FULL")
sys.stdin.readline()  # the test says when the watcher sleeps
conn.execute("INSERT INTO t VALUES (1)")
print(time.monotonic(), flush=True)  # the commit returned: visible now
sys.stdin.readline()  # held open until the test has looked (it is killed: a close would checkpoint, syncing again)
"""


class _Seen(CommitWatcher):
    """A watcher that records when it saw each change of the version."""

    def __init__(self, path: str) -> None:
        super().__init__(path, lambda: None, types=lambda: ["t"], clock=datetime.now, idle=5.0)
        self.seen: list[float] = []

    def due_once(self, conn: sqlite3.Connection, now: datetime | None = None) -> bool:
        self.seen.append(time.monotonic())
        return False


def test_a_commit_held_by_a_slow_sync_is_seen_once_it_is_visible(tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("strace is missing: apt-get install -y strace (this test never skips)")
    db = str(tmp_path / "jobdeck.db")
    with sqlite3.connect(db, isolation_level=None) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE t (x)")
    setup.close()
    watcher = _Seen(db)
    watcher.start()
    writer = subprocess.Popen(
        [strace, "-qq", "-f", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e", "signal=none",
         "-e", f"inject=fsync,fdatasync:delay_exit={SYNC_DELAY_US}", sys.executable, "-c", WRITER, db],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdin is not None and writer.stdout is not None
        wait_for(watcher.sleeping.is_set, 10, message="the watcher to sleep with nothing written")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        committed = float(writer.stdout.readline())
        wait_for(lambda: [s for s in watcher.seen if s >= committed - 0.01], 15, message="the watcher to see it")
        seen = min(s for s in watcher.seen if s >= committed - 0.01)
        assert seen - committed < 1.5, f"seen {seen - committed:.2f} s after the commit became visible"
    finally:
        writer.kill()
        writer.wait(timeout=30)
        if writer.stdin is not None:
            writer.stdin.close()
        if writer.stdout is not None:
            writer.stdout.close()
        watcher.stop()
