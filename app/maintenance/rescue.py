"""The stalled-job sweeper (after Oban's Lifeline): ``sweep_once`` rescues
running jobs whose heartbeat is older than ``stall_timeout``
(``Store.rescue_stalled``: the attempt is recorded as "stalled: worker W
stopped heart-beating at T" and the fail rule sends the job to ``failed`` or,
with no retries left, ``dead``) and marks silent workers gone. Every update
is conditional, so several processes may sweep at once. On PostgreSQL it
then ends a gone worker's sessions that are caught inside a transaction (a
partition mid-write): their row locks would hide its jobs from the rescue.

It rescues nothing for one ``stall_timeout`` after a write of this process
met an outage (``jobdeck.store.storage``): a full disk or a database that was
down stopped every process's heartbeats and acknowledgements too, and a
job whose handler finished must not run again because they were late.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobdeck.core.clock import RESCUE_SKEW_FRACTION, Clock, DatabaseClock, HostClock
from jobdeck.store.server_sessions import end_sessions_of
from jobdeck.store.upkeep import mark_silent_workers
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from jobdeck.store import Store

log = logging.getLogger("jobdeck.maintenance")


class Rescue:
    """The sweeper of one store: its clock (whose readings it checks before
    judging anyone stalled) and ``stall_timeout``."""

    def __init__(self, store: Store, clock: Clock, stall_timeout: float) -> None:
        self.store = store
        self.clock = clock
        self.stall_timeout = stall_timeout

    def sweep_once(self, now: datetime) -> list[int]:
        """Rescue stalled jobs; mark workers gone that stopped heart-beating
        without stopping (and un-mark one that came back). Returns the ids of
        the rescued jobs."""
        timeout = self.stall_timeout
        if not self._clock_agrees(timeout):
            return []
        if self.store.storage.failed_within(timeout):
            # Writes failed here lately, so they failed for the others too: their
            # heartbeats and acknowledgements get one stall timeout to land first.
            return []
        rescued = self.store.rescue_stalled(now, timeout)
        for job in rescued:
            log.warning("rescued job %s (%s) -> %s: %s", job.id, job.type, job.status.value, job.error,
                        extra={"event": "job.rescued", "job_id": job.id, "job_type": job.type,
                               "state": job.status.value})  # fmt: skip
        gone = mark_silent_workers(self.store, now, now - timedelta(seconds=timeout))
        for worker_id in gone:
            log.warning("worker %s stopped heart-beating; marked gone", worker_id)
        if gone:
            self._end_sessions_of(gone)
        return [j.id for j in rescued]

    def _end_sessions_of(self, gone: list[str]) -> None:
        """End the gone workers' database sessions caught inside a transaction,
        whose row locks would keep their jobs from being rescued
        (``jobdeck.store.server_sessions.end_sessions_of``); the next sweep rescues them."""
        try:
            ended = end_sessions_of(self.store, gone)
        except DBAPIError as exc:
            refused = [str(exc)]
        else:
            refused = ended.refused
            if ended.count:
                log.warning("ended %d database session(s) of gone workers %s caught inside a transaction",
                            ended.count, ", ".join(gone), extra={"event": "worker.sessions_ended"})  # fmt: skip
        if refused:
            log.warning("could not end the database sessions of gone workers %s: %s; a job whose row one of "
                        "them holds is rescued once the server ends that session", ", ".join(gone),
                        "; ".join(refused))  # fmt: skip

    def _clock_agrees(self, stall_timeout: float) -> bool:
        """Before judging anyone stalled, look at this process's clock: on
        PostgreSQL measure it against the database's, on SQLite compare the
        host's wall clock with the boot clock. A clock that is off by more
        than a fraction of ``stall_timeout`` (a process that was suspended, a
        reading gone stale), or that stepped within the last
        ``stall_timeout`` (NTP set this host's clock, or the database's),
        would judge heartbeats written on another time line: this sweep
        rescues nothing. The clock takes up the fresh reading, and once every
        live process has beaten on the new time line the sweeps rescue again."""
        clock = self.clock
        limit = stall_timeout * RESCUE_SKEW_FRACTION
        if isinstance(clock, HostClock):
            clock.check()
        elif isinstance(clock, DatabaseClock):
            checked = clock.drift()
            if checked is not None and (checked[0] > limit or checked[1].uncertainty > limit):
                log.warning(
                    "this process's clock was %.3f s off the database's (reading uncertain by %.3f s), more than "
                    "%g s (%g of stall_timeout): this sweep rescues nothing",
                    checked[0], checked[1].uncertainty, limit, RESCUE_SKEW_FRACTION,
                    extra={"event": "clock.sweep_skipped", "drift": checked[0]},
                )  # fmt: skip
                return False
        else:
            return True  # a clock the caller injected
        if clock.stepped_within(stall_timeout):
            log.info("the clock stepped less than stall_timeout ago: this sweep rescues nothing")
            return False
        return True
