"""The one clock for what crosses processes.

Heartbeats and the stall cutoff, worker liveness, ``available_at``, rate
windows, unique periods and cron fire times are written by one process and
compared by another. On SQLite every process shares one host, and so one
clock: the deck uses the host's. On PostgreSQL the processes may run on
several hosts whose clocks disagree; a host 90 s ahead rescued jobs that
were alive on another, a second after they were claimed, and ran them
twice. There the deck's clock is a ``DatabaseClock``: the database's
``clock_timestamp()``, read with the round trip measured, then carried
forward on this process's monotonic clock. A step of the host's wall clock
between two readings changes nothing; the offset between the host and the
database is shown (Workers page, ``/metrics``) and warned about, never
trusted.

Tests inject a clock of their own (a settable one); the deck then uses it
as it is. A ``DatabaseClock`` over a skewed host clock is how a test makes a
host whose clock disagrees.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

log = logging.getLogger("jobdeck.clock")

Clock = Callable[[], datetime]


def host_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Reading:
    """One measurement of the database's clock against this process's."""

    database: datetime
    """The database's ``clock_timestamp()``."""
    mono: float
    """This process's monotonic clock at the middle of the round trip."""
    offset: float
    """Seconds the database's clock is ahead of this host's wall clock (negative: behind)."""
    uncertainty: float
    """Half the round trip: how far off ``database`` may be from the middle."""


SAMPLES = 3
"""Round trips per measurement; the shortest one is kept."""


class DatabaseClock:
    """``now()`` on the database's time line: the last reading carried
    forward on the monotonic clock, or the host's clock before any reading.

    ``read`` is the store's ``database_time`` (None on SQLite: then the host's
    clock is the shared one and nothing is measured)."""

    def __init__(self, host: Clock | None = None, warn_after: float = 1.0) -> None:
        self.host: Clock = host or host_now
        self.warn_after = warn_after
        """Seconds of offset past which ``measure`` logs a warning."""
        self.read: Callable[[], datetime] | None = None
        self.reading: Reading | None = None
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self) -> datetime:
        r = self.reading
        if r is None:
            return self.host()
        return r.database + timedelta(seconds=time.monotonic() - r.mono)

    @property
    def offset(self) -> float | None:
        """Seconds the database's clock is ahead of this host's at the last reading."""
        r = self.reading
        return None if r is None else r.offset

    def sample(self) -> Reading | None:
        """Read the database's clock ``SAMPLES`` times and keep the reading
        with the shortest round trip; None where nothing is measured. Does
        not change the clock (``measure`` does). Database errors are raised."""
        if self.read is None:
            return None
        best: Reading | None = None
        for _ in range(SAMPLES):
            before_mono, before_wall = time.monotonic(), self.host()
            database = self.read()
            after_mono, after_wall = time.monotonic(), self.host()
            half = (after_mono - before_mono) / 2
            wall = before_wall + (after_wall - before_wall) / 2
            reading = Reading(database, before_mono + half, (database - wall).total_seconds(), half)
            if best is None or reading.uncertainty < best.uncertainty:
                best = reading
        return best

    def measure(self) -> Reading | None:
        """Take a new reading and run on it from now on; warn when the host's
        clock is off the database's by more than ``warn_after``."""
        reading = self.sample()
        if reading is None:
            return None
        with self._lock:
            self.reading = reading
        self._warn(reading)
        return reading

    def drift(self) -> tuple[float, Reading] | None:
        """A fresh reading, and how far this clock was from it (seconds,
        either way) before it was taken up: what the sweeper checks before
        it rescues anything. None where nothing is measured."""
        reading = self.sample()
        if reading is None:
            return None
        mine = self.reading
        ours = self.host() if mine is None else mine.database + timedelta(seconds=reading.mono - mine.mono)
        with self._lock:
            self.reading = reading
        self._warn(reading)
        return abs((reading.database - ours).total_seconds()), reading

    def _warn(self, reading: Reading) -> None:
        off = abs(reading.offset)
        if off > self.warn_after and not self._warned:
            log.warning(
                "this host's clock is %.3f s %s the database's: Jobdeck runs on the database's clock, "
                "but check NTP on this host (warned past clock_skew_warn = %g s)",
                off, "behind" if reading.offset > 0 else "ahead of", self.warn_after,
                extra={"event": "clock.skew", "offset": reading.offset},
            )  # fmt: skip
        elif off <= self.warn_after and self._warned:
            log.info("this host's clock agrees with the database's again (offset %.3f s)", reading.offset)
        self._warned = off > self.warn_after


def offset_of(clock: Clock) -> float | None:
    """The measured offset of a deck's clock, or None (SQLite, an injected clock, not yet measured)."""
    return clock.offset if isinstance(clock, DatabaseClock) else None
