"""Wait, without polling, until a SQLite file may have changed: Linux's
inotify on the file's folder, read through ``ctypes`` (the standard library
has no binding, and the part used here is three calls).

The commit watcher (``jobdeck.worker.commit_watch``) reads
``PRAGMA data_version`` to learn that another connection committed. Read
every 5 ms, that was about 200 wake-ups a second and 3 to 4% of a core in
every idle ``jobdeck worker`` and ``jobdeck serve``. A commit writes its
pages to the ``-wal`` file (or, outside WAL mode, to the database and its
``-journal``), and each write is an inotify event; so the watcher can sleep
until one arrives, and read the pragma only then.

An event says that a write happened, not that the commit is visible: a
commit becomes visible after its last write, once the writer has synced the
file and updated the WAL index in shared memory (a memory write, no event).
So a caller keeps reading for a while after each event (``CommitWatcher``:
``HOT``), and still reads now and then with no event at all, in case the
file's folder gives none (a network mount written from another machine).

The folder is watched, not the files: the ``-wal`` and ``-journal`` files
come and go. ``open_changes`` returns None where inotify is missing (not
Linux) or refused (the per-user limit of instances, 128 by default, or no
file descriptor left), and the caller then polls as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import sys
import threading
from pathlib import Path

log = logging.getLogger("jobdeck.commit_watch")

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
MASK = IN_MODIFY | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF
"""A write, a file moved in or made; the folder itself removed (then every
wait answers at once: the caller falls back to reading every few
milliseconds). A folder renamed is still watched (inotify follows it) and its
files keep their names, so a rename changes nothing here. A file closed is
left out: a connection closing writes nothing a commit needs seen."""
_EVENT = struct.Struct("iIII")
"""``struct inotify_event`` before its name: wd, mask, cookie, len."""
_SUFFIXES = ("", "-wal", "-journal")
"""The files a commit to a database writes (``-shm`` is written through memory)."""

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(None, use_errno=True)  # the C library Python itself runs on
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            _libc = lib
        except (OSError, AttributeError):  # a C library without inotify
            return None
    return _libc


class FileChanges:
    """An inotify instance watching one folder for writes to one database's
    files, and a pipe that ``interrupt`` writes to, so ``wait`` returns at
    once when its owner stops."""

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names
        self._closed = False
        self._lock = threading.Lock()
        """Held to write to the pipe or close it: a write after the close could
        land in whatever file took the pipe's number since."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self.gone = False
        """The watched folder was removed: no event will come any more."""

    def wait(self, timeout: float) -> bool:
        """Sleep until one of the database's files is written, ``interrupt``
        is called or ``timeout`` seconds pass; True if a file was written
        (or events were lost, or the folder is gone: the caller must look)."""
        if self.gone:
            return True
        ready = {fd for fd, _ in self._poll.poll(max(0, int(timeout * 1000)))}
        return self._fd in ready and self._drain()

    def _drain(self) -> bool:
        written = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return written
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & (IN_DELETE_SELF | IN_IGNORED):
                    if not self.gone:
                        log.warning("commit watcher: the database's folder was removed; polling every few milliseconds")
                    self.gone = True
                    written = True
                elif mask & IN_Q_OVERFLOW or name in self._names:
                    written = True

    def interrupt(self) -> None:
        """Make a ``wait`` in progress return now, and every later one (the owner is stopping)."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(OSError):  # the pipe is full: a wake is pending already
                os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Close the instance and the pipe (by the thread that waits on them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                os.close(fd)


def open_changes(database: str) -> FileChanges | None:
    """Watch the folder of the SQLite file ``database``; None where inotify
    cannot be had (the caller polls instead, and this says why once in the
    log at info)."""
    lib = _lib()
    if lib is None:
        return None
    given = Path(database).absolute()
    paths = {given, given.resolve()}  # a symlinked file: SQLite may write beside either
    fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        log.info("commit watcher: no inotify instance (%s); polling every few milliseconds", os.strerror(err))
        return None
    for folder in {path.parent for path in paths}:
        if lib.inotify_add_watch(fd, os.fsencode(folder), MASK) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            reason = "the per-user limit of watches" if err == errno.ENOSPC else os.strerror(err)
            log.info("commit watcher: cannot watch %s (%s); polling every few milliseconds", folder, reason)
            return None
    names = frozenset(os.fsencode(path.name + suffix) for path in paths for suffix in _SUFFIXES)
    try:
        return FileChanges(fd, names)
    except OSError as exc:  # its pipe: out of file descriptors for a moment (EMFILE)
        os.close(fd)
        log.info("commit watcher: cannot watch %s (%s); polling every few milliseconds", paths, exc)
        return None
