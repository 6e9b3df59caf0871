"""Which process wrote a row, and whether it is still running.

A bulk action's audit entry names the process that moved its last batch
(``jobdeck.store.audit``), so that a reader can tell an action cut short by a
dead process from one still going. The name is ``host:pid:boot.start``: the
host, the process id, and the kernel's boot id and the process's start time
(``/proc``), which together name one process for the life of the machine (a
pid alone is reused). A reader on the same host can then tell for certain
whether that process still runs; a reader on another host cannot, and goes
by how long the action has made no progress instead.
"""

from __future__ import annotations

import os
import secrets
import socket
from functools import cache
from pathlib import Path

HOST = socket.gethostname()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot, or None
    when there is no such process (or no ``/proc`` to ask)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # ended, not yet reaped
        return None
    return fields[19]


@cache
def _identity(pid: int) -> str:
    return f"{HOST}:{pid}:{_boot_id()}.{_started(pid) or ''}"


def identity() -> str:
    """This process's name for the rows it writes (a fork gets its own)."""
    return _identity(os.getpid())


@cache
def _nonce(pid: int) -> str:
    return secrets.token_hex(3)


def name() -> str:
    """``host:pid.nonce``: this process (a fork gets its own) in its pools'
    worker ids (``host:pid.nonce:pool``) and its PostgreSQL sessions'
    ``application_name`` (``jobdeck.store.engine.session_name``), by which a
    sweeper ends the sessions of a worker it marks gone. Host and pid alone
    name two live processes at once (containers each run their command as
    pid 1: replicas with the host's name, one restarted under its old name),
    and a sweep would end the sessions of the one that runs; the random part
    tells them apart."""
    pid = os.getpid()
    return f"{HOST}:{pid}.{_nonce(pid)}"


def gone(owner: str) -> bool | None:
    """True when ``owner`` (an ``identity``) was a process of this host
    that no longer runs, False when it still runs, None when this process
    cannot tell (another host, or no ``/proc``)."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3:
        return None
    host, pid, marker = parts
    boot, _, start = marker.partition(".")
    if host != HOST or not start or not boot or boot != _boot_id() or not pid.isdigit():
        return None
    return _started(int(pid)) != start
