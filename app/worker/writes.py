"""The pool's writes during an outage: retried until they land, never
dropped because the database was briefly unreachable, full or read-only;
and while one is failing the pool claims nothing new. ``stop`` sets a
deadline past which they are no longer tried."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from jobdeck.store.faults import Outage
from jobdeck.store.storage import StorageHealth
from jobdeck.worker.lease import Lease
from sqlalchemy.exc import DisconnectionError

log = logging.getLogger("jobdeck.worker")
T = TypeVar("T")

STOP_MARGIN = 2.0
"""Seconds beyond ``shutdown_grace`` that ``stop`` keeps retrying its final
writes while the database is unreachable; then it gives up (the jobs it
could not write stay ``running`` until the stalled sweep rescues them)."""

RETRY_CAP = 1.0
"""Longest pause between retries of a write (or a claim) during an outage:
once the database is back, work resumes within about this long."""


class Unreachable(DisconnectionError):
    """A write the stopping pool does not try: the database is not answering.
    An outage like a lost connection to whoever handles it (the outcomes are kept)."""


class Writes:
    """Retries the pool's writes (see the module docstring). ``landed`` is
    called when a write lands after failing: claim again at once."""

    def __init__(self, storage: StorageHealth, lease: Lease, landed: Callable[[], None]) -> None:
        self.storage = storage
        self.lease = lease
        self.landed = landed
        self.outage: Outage | None = None
        """Why the last write failed while it is still being retried (no claims meanwhile)."""
        self.give_up_at: float | None = None
        """Set by ``stop``: past it, ``retrying`` stops retrying."""

    def stop_by(self, deadline: float) -> None:
        self.give_up_at = deadline

    def hurry(self) -> None:
        """Give up now rather than at the stop's deadline (a second shutdown signal)."""
        if self.give_up_at is not None:
            self.give_up_at = min(self.give_up_at, time.monotonic())

    def time_left(self) -> float:
        return 30.0 if self.give_up_at is None else max(0.0, self.give_up_at - time.monotonic())

    def retrying(self, fn: Callable[[], T]) -> T:
        """Run a store write until it succeeds, retrying only what can
        succeed on a later try (``jobdeck.store.faults.outage_of``): an error
        that can never succeed (a value the database refuses) is raised at
        once instead of wedging the pool. While a write fails so, ``outage``
        says why. While stopping, retries end at the stop's deadline
        (``shutdown_grace`` + ``STOP_MARGIN``)."""
        delay = 0.05
        failed = False
        if self.give_up_at is not None and self.lease.lost:
            # Stopping, and no beat has landed for half of stall_timeout: each
            # try would wait out a connect or a dropped connection (5-15 s);
            # what is not written is kept (``keep_unlanded``) or rescued.
            raise Unreachable("the database has not answered for half of stall_timeout; stopping without writing")
        while True:
            try:
                result = fn()
            except Exception as exc:
                outage = self.storage.note(exc)
                if outage is None:
                    raise
                self.outage = outage
                give_up = self.give_up_at
                if give_up is not None and time.monotonic() + delay > give_up:
                    log.error("database write failed (%s) while stopping; giving up", outage.cause)
                    raise
                log.warning("database write failed (%s: %s); retrying in %.2fs", exc.__class__.__name__,
                            outage.cause, delay)  # fmt: skip
                time.sleep(delay)  # backoff between retries of one write; nothing to wake for
                delay = min(RETRY_CAP, delay * 2)
                failed = True
                continue
            if failed:  # it landed: claim again at once
                self.outage = None
                self.storage.wrote()
                self.landed()
            return result
