"""A pool's lease on the jobs it holds, and what the pool does when it is lost.

Every other process judges this one's jobs by its heartbeats: once its last
beat is ``stall_timeout`` old (on the database's clock), any sweeper rescues
its jobs and another process runs them. A process cut off from the database
(a partition, the database down, a machine too starved to beat) cannot see
that happen, so it keeps its own count on its monotonic clock: when no beat
has landed for half of ``stall_timeout``, it knows the lease is going, and
before anyone else may take the jobs over it

- tells its running handlers (``ctx.cancelled`` set, ``ctx.cancel_reason``
  "lease lost"), so a handler that checks stops before another host starts;
- stops claiming, and starts none of the jobs it claimed but has not started;
- keeps every outcome it has for the acker, which writes them, fenced, when
  the database answers again: those of jobs rescued meanwhile are refused.

When a beat lands again the lease is back: the jobs it never started, and
those whose handlers stopped for the lost lease, are released to ``pending``
(fenced: one rescued meanwhile is not touched) and claiming resumes, with no
restart. A handler that ignores ``ctx.cancelled`` runs on; its late result
is refused if the job was rescued, and ``ctx.effect`` keeps its side effect
from being performed twice.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

from jobdeck.core.clock import since_boot
from jobdeck.store import JobRecord

LEASE_LOST = "lease lost"
"""``ctx.cancel_reason`` when the pool lost its lease."""
TIMED_OUT = "timed out"
"""``ctx.cancel_reason`` when the handler ran past its type's timeout."""
RELEASED = "released at shutdown"
"""``ctx.cancel_reason`` when a stop's grace ended with the handler still running."""


class CancelSignal(threading.Event):
    """A handler's ``ctx.cancelled``: a ``threading.Event`` that also says
    why it was set.

    Every attempt gets one and few are ever waited on, so its condition is
    made when first used (a ``wait``, ``set`` or ``clear``), not with the
    signal: ``threading.Event()`` builds a ``Condition`` (which, for a plain
    lock, catches three ``AttributeError``s), and that was a fifth of the
    executors' time with the GIL in a drain of no-op jobs, time the acker
    waited for. ``threading.Event``'s own methods run unchanged on its
    ``_flag`` and ``_cond``; ``_cond`` is a property here that makes the
    condition once, by an atomic ``dict.setdefault`` rather than under a
    lock (a lock held by another thread at an ``os.fork`` would be copied
    held into the child). Pickling it fails as a ``threading.Event``'s does
    (a copy in another process would never see the cancel)."""

    def __init__(self) -> None:  # noqa: PLW0231 (``_cond`` is made when first used)
        self._flag = False
        self.reason: str | None = None

    @property
    def _cond(self) -> threading.Condition:
        made: threading.Condition | None = self.__dict__.get("_made")
        if made is None:  # two threads may build one each; the first stored is everyone's
            made = self.__dict__.setdefault("_made", threading.Condition(threading.Lock()))
        return made

    def __getstate__(self) -> dict[str, object]:
        """Its state with the condition in it: ``pickle`` refuses its lock, and
        ``copy.copy`` shares it, as for a ``threading.Event``."""
        self._cond  # noqa: B018 (made, so it is part of the state)
        return self.__dict__

    def cancel(self, reason: str) -> None:
        if not self.is_set():
            self.reason = reason
        self.set()


@dataclass
class SetAside:
    """A job this pool holds but will not run or acknowledge while the lease
    is lost: released when it is back. ``started`` when its handler ran (the
    release records the attempt as interrupted)."""

    job: JobRecord
    started: datetime | None = None


class Lease:
    """How long since this pool's last heartbeat landed (``since_boot``).

    Two threads use it and neither waits on the other: a watchdog that does
    no I/O asks ``expired`` (a thread that writes can be stuck on a dropped
    connection, or behind a lock, for longer than the lease), and the
    heartbeat thread calls ``renew`` after each beat that landed."""

    def __init__(self, stall_timeout: float) -> None:
        self.ttl = stall_timeout / 2
        """No beat for this long and the lease is lost."""
        self.renewed = since_boot()
        self.lost_at: float | None = None
        self._lock = threading.Lock()

    @property
    def lost(self) -> bool:
        return self.lost_at is not None

    def expired(self, now: float | None = None) -> bool:
        """True the moment the lease runs out (once, until it is regained)."""
        now = since_boot() if now is None else now
        with self._lock:
            if self.lost_at is None and now - self.renewed > self.ttl:
                self.lost_at = now
                return True
        return False

    def renew(self, beat_started: float) -> bool:
        """A beat that started at ``beat_started`` (``since_boot``) landed: the
        heartbeat it wrote is at least that recent. True when this gives a
        lost lease back (a beat that started before the loss does not)."""
        with self._lock:
            self.renewed = max(self.renewed, beat_started)
            if self.lost_at is not None and self.renewed > self.lost_at:
                self.lost_at = None
                return True
        return False
