"""Outcomes a stopping pool could not write, kept on local disk for the next
pool on this host, so a job whose handler finished does not run again
because the database was down, full or read-only when the process stopped.

Each pool reserves its file when it starts (``<instance_path>/acks/<worker
id>.acks``, ``RESERVE`` bytes allocated up front), so the outcomes still
fit when the disk that holds both the file and a SQLite database is full.
The pool holds an exclusive ``flock`` on it while it lives. At ``stop`` the
outcomes that did not land are written into it and synced (``keep``);
nothing kept, the file goes.

Any pool on the host (the same process restarted, or another one sharing
the instance folder) adopts the file of a pool that is gone (its lock is
free): it writes the kept outcomes as that worker's (fenced by worker and
attempt like every acknowledgement, so one the stalled sweep rescued
meanwhile is refused) and removes the file once they landed. A pool on
another host cannot see it: its sweep rescues the job after
``stall_timeout``, and it runs again (at-least-once).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jobdeck.store import Outcome

log = logging.getLogger("jobdeck.worker")

RESERVE = 1 << 20
"""Bytes each pool reserves for the outcomes it may have to keep (some
hundreds of outcomes with their tracebacks)."""
SUFFIX = ".acks"


def _encode(o: Outcome) -> bytes:
    record = {
        "job_id": o.job_id, "worker_id": o.worker_id, "attempt": o.attempt,
        "started_at": o.started_at.isoformat() if o.started_at else None, "error": o.error,
        "traceback": o.traceback, "result": o.result, "retryable": o.retryable, "kind": str(getattr(o.kind, "value", o.kind)),
        "snooze": o.snooze, "snooze_reason": o.snooze_reason, "max_snoozes": o.max_snoozes,
        "executor": o.executor,
    }  # fmt: skip
    return json.dumps(record, separators=(",", ":"), default=repr).encode() + b"\n"


def _decode(line: bytes) -> Outcome | None:
    try:
        r: dict[str, Any] = json.loads(line)
        started = datetime.fromisoformat(r["started_at"]) if r["started_at"] else None
        return Outcome(
            r["job_id"], r["worker_id"], attempt=r["attempt"], started_at=started, error=r["error"],
            traceback=r["traceback"], result=r["result"], retryable=r["retryable"], kind=r["kind"],
            snooze=r["snooze"], snooze_reason=r["snooze_reason"], max_snoozes=r["max_snoozes"],
            executor=r.get("executor"),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):  # a line cut short by a crash while it was written
        return None


def _read(fd: int) -> list[Outcome]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0).split(b"\0", 1)[0]
    return [o for o in (_decode(line) for line in data.splitlines() if line.strip()) if o is not None]


class AckSpool:
    """This pool's reserved file (see the module docstring)."""

    def __init__(self, folder: Path, worker_id: str) -> None:
        self.folder = folder
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in worker_id)
        self.path = folder / f"{name}{SUFFIX}"
        self._fd: int | None = None

    def reserve(self) -> None:
        """Create, allocate and lock the file. Raises OSError when the folder
        cannot take it (the pool then runs without one, and says so)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.posix_fallocate(fd, 0, RESERVE)
            os.replace(tmp, self.path)  # only a locked, allocated file carries the name adopters look for
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._fd = fd

    def keep(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Write ``outcomes`` into the file and sync it; returns those that
        were not kept (the file's room is used first, then it may grow; a
        file system that refuses the sync keeps none)."""
        if self._fd is None:
            return outcomes
        offset = kept = 0
        for o in outcomes:
            line = _encode(o)
            try:
                if os.pwrite(self._fd, line, offset) != len(line):
                    raise OSError("short write")
            except OSError as exc:
                log.error("keeping outcomes: %d of %d did not fit (%s)", len(outcomes) - kept, len(outcomes), exc)
                break
            offset += len(line)
            kept += 1
        try:
            with contextlib.suppress(OSError):  # past the reservation on a full disk: the reader stops at a cut line
                os.pwrite(self._fd, b"\0", offset)
            os.fsync(self._fd)
        except OSError as exc:
            log.error("keeping outcomes failed: the file system refused them (%s)", exc)
            return outcomes
        return outcomes[kept:]

    def close(self, kept: bool) -> None:
        """Release the file (and its lock); removed unless outcomes were kept in it."""
        if self._fd is None:
            return
        if not kept:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)
        self._fd = None


@dataclass
class Orphan:
    """A gone pool's file, locked by this process until ``done``."""

    path: Path
    fd: int
    outcomes: list[Outcome]

    def done(self, landed: bool) -> None:
        """Remove the file when its outcomes landed; release it either way."""
        if landed:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self.fd)


def orphans(folder: Path, own: Path | None = None) -> Iterator[Orphan]:
    """The files of pools that are gone, each locked while the caller holds
    it. Files of live pools (locked) are skipped; empty ones are removed."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return
    for name in names:
        path = folder / name
        if path == own or not (name.endswith(SUFFIX) or name.endswith(SUFFIX + ".tmp")):
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # a live pool's
            continue
        if os.fstat(fd).st_nlink == 0:  # adopted by another process while this one waited
            os.close(fd)
            continue
        kept = _read(fd) if name.endswith(SUFFIX) else []
        orphan = Orphan(path, fd, kept)
        if not kept:
            orphan.done(landed=True)
            continue
        yield orphan
