"""Maintenance loops, each a thin body around store calls (after Oban's
Lifeline and Pruner): the stalled-job sweeper, retention, and the per-minute
counters the dashboard's charts read.

``sweep_once`` rescues running jobs whose heartbeat is older than
``stall_timeout`` (``Store.rescue_stalled``: the attempt is recorded as
"stalled: worker W stopped heart-beating at T" and the fail rule sends the job
to ``failed`` or, with no retries left, ``dead``) and marks silent workers
gone. Every update is conditional, so several processes may sweep at once.
It rescues nothing for one ``stall_timeout`` after a write of this process
met an outage (``jobdeck.store.storage``): a full disk or a database that was
down stopped every process's heartbeats and acknowledgements too, and a
job whose handler finished must not run again because they were late.

Retention (``[retention]`` in config)::

    completed_days = 7      # completed and discarded jobs, with their attempts
    dead_days = 0           # 0 keeps dead jobs until a person acts
    stats_days = 30         # per-minute counters
    batch = 1000            # rows per delete transaction

An idempotency key is remembered exactly as long as its job row exists: after
a completed job is pruned, enqueueing its key again creates a new job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.clock import RESCUE_SKEW_FRACTION, DatabaseClock, HostClock
from jobdeck.core.config import Config, ConfigError
from jobdeck.core.states import ENDED, FINISHED, State
from jobdeck.store.upkeep import (
    mark_silent_workers,
    prune_finished,
    prune_stats,
    prune_workers,
    prune_workflows,
    roll_up_minutes,
    stats_since,
    whole_minute,
)

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck

log = logging.getLogger("jobdeck.maintenance")

STATS_SETTLE = timedelta(seconds=30)
"""A minute is rolled up this long after it ends, so late acks land in it."""


@dataclass(frozen=True)
class Retention:
    completed_days: float = 7.0
    dead_days: float = 0.0
    stats_days: float = 30.0
    batch: int = 1000
    max_batches: int = 20
    """Per call, so one prune never holds the database for long."""


def parse_retention(config: Config) -> Retention:
    raw = config.extra.get("retention", {})
    if not isinstance(raw, dict):
        raise ConfigError("retention: expected a table")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in Retention.__dataclass_fields__ or key == "max_batches":
            raise ConfigError(f"retention.{key}: unknown key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"retention.{key}: must be a number >= 0, got {value!r}")
        values[key] = int(value) if key == "batch" else float(value)
    retention = Retention(**values)
    if retention.batch < 1 or retention.completed_days <= 0 or retention.stats_days <= 0:
        raise ConfigError("retention: completed_days, stats_days and batch must be > 0")
    return retention


class Maintenance:
    """The sweeper, retention and the roll-up of one deck: when and with which
    settings; the statements are ``jobdeck.store.upkeep``'s."""

    def __init__(self, deck: Jobdeck, retention: Retention | None = None) -> None:
        self.deck = deck
        self.store = deck.store
        self.retention = retention or parse_retention(deck.config)

    # -- the sweeper ------------------------------------------------------------

    def sweep_once(self, now: datetime) -> list[int]:
        """Rescue stalled jobs; mark workers gone that stopped heart-beating
        without stopping (and un-mark one that came back). Returns the ids of
        the rescued jobs."""
        timeout = self.deck.config.stall_timeout
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
        for worker_id in mark_silent_workers(self.store, now, now - timedelta(seconds=timeout)):
            log.warning("worker %s stopped heart-beating; marked gone", worker_id)
        return [j.id for j in rescued]

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
        clock = self.deck.clock
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

    # -- retention --------------------------------------------------------------

    def prune_once(self, now: datetime) -> dict[str, int]:
        """Delete finished jobs (and dead ones, with ``dead_days``) past their
        age in batches, with their attempts; old counters; long-gone workers."""
        r = self.retention
        batches = {"batch": r.batch, "max_batches": r.max_batches}
        pruned = {"jobs": 0, "dead": 0, "stats": 0, "workers": 0}
        pruned["jobs"] = prune_finished(self.store, FINISHED, now - timedelta(days=r.completed_days), **batches)
        if r.dead_days > 0:
            pruned["dead"] = prune_finished(self.store, [State.DEAD], now - timedelta(days=r.dead_days), **batches)
        completed_before = now - timedelta(days=r.completed_days)
        pruned["jobs"] += prune_workflows(self.store, FINISHED, completed_before, max_batches=r.max_batches)
        if r.dead_days > 0:
            dead_before = min(completed_before, now - timedelta(days=r.dead_days))
            pruned["dead"] += prune_workflows(self.store, ENDED, dead_before, max_batches=r.max_batches)
        pruned["stats"] = prune_stats(self.store, now - timedelta(days=r.stats_days))
        pruned["workers"] = prune_workers(self.store, now - timedelta(days=r.completed_days))
        if any(pruned.values()):
            log.info("retention pruned %s", pruned)
        return pruned

    # -- per-minute counters ------------------------------------------------------

    def rollup_once(self, now: datetime) -> int:
        """Close the minutes that ended at least ``STATS_SETTLE`` ago into
        ``stats_minutely``; returns how many minutes were closed."""
        return roll_up_minutes(self.store, whole_minute(now - STATS_SETTLE))

    def stats(self, since: datetime, job_type: str | None = None) -> list[dict[str, Any]]:
        """Counters from ``since`` on, oldest first (for the dashboard's charts)."""
        return stats_since(self.store, since, job_type)
