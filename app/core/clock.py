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

Clocks also step: NTP sets a host's wall clock, or the database host's,
forward or back. A clock that stepped makes every heartbeat written before
the step look older, or younger, than it is, to whoever reads it after. So
each clock here notices a step (``stepped_within``), and the sweeper
rescues nothing for a whole ``stall_timeout`` after one: long enough for
every live process to beat again on the new time line.

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


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def since_boot() -> float:
    """Seconds on a clock that never steps and keeps counting while the
    machine or VM is suspended (``CLOCK_BOOTTIME``; the monotonic clock where
    there is none). The monotonic clock stops during a suspend."""
    return time.clock_gettime(_BOOTTIME)


@dataclass(frozen=True)
class Reading:
    """One measurement of the database's clock against this process's."""

    database: datetime
    """The database's ``clock_timestamp()``."""
    at: float
    """``since_boot()`` at the middle of the round trip."""
    offset: float
    """Seconds the database's clock is ahead of this host's wall clock (negative: behind)."""
    uncertainty: float
    """Half the round trip: how far off ``database`` may be from the middle."""


SAMPLES = 3
"""Round trips per measurement; the shortest one is kept."""

RESCUE_SKEW_FRACTION = 0.25
"""A clock that steps, or is off the database's, by more than this fraction
of ``stall_timeout`` keeps its process's sweeper from rescuing anything."""


class Steps:
    """When a clock last moved by more than ``limit`` seconds at once."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.last: float | None = None
        """``since_boot()`` when the last step was seen."""

    def saw(self, jump: float, what: str) -> bool:
        """Record a jump of ``jump`` seconds; True (and a warning) when it is a step."""
        if abs(jump) <= self.limit:
            return False
        self.last = since_boot()
        log.warning(
            "%s stepped %+.3f s: heartbeats written before the step are judged on another time line, "
            "so this process's sweeper rescues nothing for a stall_timeout",
            what, jump, extra={"event": "clock.step", "jump": jump},
        )  # fmt: skip
        return True

    def within(self, seconds: float) -> bool:
        return self.last is not None and since_boot() - self.last < seconds


class HostClock:
    """SQLite's clock: this host's wall clock, shared by every process on the
    file, and a watch for its steps (``check``)."""

    def __init__(self, host: Clock | None = None, step_limit: float = 15.0) -> None:
        self.host: Clock = host or host_now
        self.steps = Steps(step_limit)
        self._base: float | None = None
        """The wall clock minus ``since_boot()`` at the last check: constant until the wall clock steps."""

    def __call__(self) -> datetime:
        return self.host()

    def check(self) -> float:
        """Compare the wall clock with ``since_boot`` since the last check;
        returns the jump (0.0 when it did not step)."""
        base = self.host().timestamp() - since_boot()
        jump = 0.0 if self._base is None else base - self._base
        self._base = base
        self.steps.saw(jump, "this host's clock")
        return jump

    def stepped_within(self, seconds: float) -> bool:
        return self.steps.within(seconds)


class DatabaseClock:
    """``now()`` on the database's time line: the last reading carried
    forward on ``since_boot``, or the host's clock before any reading.

    ``read`` is the store's ``database_time`` (None on SQLite: then the host's
    clock is the shared one and nothing is measured)."""

    RETRY_FIRST_READING = 5.0
    """Seconds between tries at a first reading made from ``now()`` itself."""

    def __init__(self, host: Clock | None = None, warn_after: float = 1.0, step_limit: float = 15.0) -> None:
        self.host: Clock = host or host_now
        self.warn_after = warn_after
        """Seconds of offset past which ``measure`` logs a warning."""
        self.steps = Steps(step_limit)
        self.read: Callable[[], datetime] | None = None
        self.reading: Reading | None = None
        self._lock = threading.Lock()
        self._warned = False
        self._tried_at: float | None = None

    def __call__(self) -> datetime:
        r = self.reading
        if r is None:
            r = self._first_reading()
            if r is None:
                return self.host()
        return r.database + timedelta(seconds=since_boot() - r.at)

    def _first_reading(self) -> Reading | None:
        """A deck that never ran ``init_db`` (a producer built with
        ``init_db=False``) reads the database's clock at its first ``now()``;
        on a host an hour ahead its delays were an hour too long. A failed
        try waits ``RETRY_FIRST_READING`` seconds; meanwhile the host's clock."""
        if self.read is None or (
            self._tried_at is not None and since_boot() - self._tried_at < self.RETRY_FIRST_READING
        ):
            return None
        self._tried_at = since_boot()
        try:
            return self.measure()
        except Exception as exc:  # the caller's own statement will meet the outage
            log.warning("reading the database's clock failed (%s); the host's clock meanwhile", type(exc).__name__)
            return None

    @property
    def offset(self) -> float | None:
        """Seconds the database's clock is ahead of this host's at the last reading."""
        r = self.reading
        return None if r is None else r.offset

    def sample(self, samples: int = SAMPLES) -> Reading | None:
        """Read the database's clock ``samples`` times and keep the reading
        with the shortest round trip; None where nothing is measured. Does
        not change the clock (``measure`` does). Database errors are raised."""
        if self.read is None:
            return None
        best: Reading | None = None
        for _ in range(samples):
            before, before_wall = since_boot(), self.host()
            database = self.read()
            after, after_wall = since_boot(), self.host()
            half = (after - before) / 2
            wall = before_wall + (after_wall - before_wall) / 2
            reading = Reading(database, before + half, (database - wall).total_seconds(), half)
            if best is None or reading.uncertainty < best.uncertainty:
                best = reading
        return best

    def _take(self, reading: Reading) -> float:
        """Run on ``reading`` from now on; returns how far this clock was from it."""
        with self._lock:
            mine, self.reading = self.reading, reading
        self._warn(reading)
        if mine is None:
            return 0.0
        jump = (reading.database - (mine.database + timedelta(seconds=reading.at - mine.at))).total_seconds()
        self.steps.saw(jump, "the database's clock (or this process's, suspended)")
        return jump

    def measure(self) -> Reading | None:
        """Take a new reading and run on it from now on; warn when the host's
        clock is off the database's by more than ``warn_after``, and note a step."""
        reading = self.sample()
        if reading is not None:
            self._take(reading)
        return reading

    def follow(self) -> float | None:
        """One round trip (each heartbeat makes one): take the reading up only
        when the clock stepped, so every process follows a step of the
        database's clock within one beat. Returns the jump, None where
        nothing is measured."""
        reading = self.sample(1)
        if reading is None:
            return None
        mine = self.reading
        if mine is None:
            return self._take(reading)
        jump = (reading.database - (mine.database + timedelta(seconds=reading.at - mine.at))).total_seconds()
        if abs(jump) - reading.uncertainty > self.steps.limit:
            return self._take(reading)
        return jump

    def drift(self) -> tuple[float, Reading] | None:
        """A fresh reading, taken up, and how far this clock was from it
        (seconds, either way): what the sweeper checks before it rescues
        anything. None where nothing is measured."""
        reading = self.sample()
        if reading is None:
            return None
        return abs(self._take(reading)), reading

    def stepped_within(self, seconds: float) -> bool:
        return self.steps.within(seconds)

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


def default_clock(*, sqlite: bool, stall_timeout: float, warn_after: float) -> Clock:
    """A deck's clock when none is injected: this host's on SQLite (one host,
    one clock), the database's on PostgreSQL (warning when the host is off
    it by more than ``warn_after`` seconds), each watching for steps larger
    than a quarter of ``stall_timeout``."""
    step_limit = stall_timeout * RESCUE_SKEW_FRACTION
    if sqlite:
        return HostClock(step_limit=step_limit)
    return DatabaseClock(warn_after=warn_after, step_limit=step_limit)


def offset_of(clock: Clock) -> float | None:
    """The measured offset of a deck's clock, or None (SQLite, an injected clock, not yet measured)."""
    return clock.offset if isinstance(clock, DatabaseClock) else None
