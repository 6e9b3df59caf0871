"""The upkeep of one store, each loop a thin body around store calls: the
stalled-job sweeper (``rescue``), retention (``prune``) and the per-minute
counters (``rollup``). ``Maintenance`` holds the three, for the scheduler's
ticks and the tests that drive them together."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.clock import Clock
from jobdeck.maintenance.prune import Prune, Retention, parse_retention
from jobdeck.maintenance.rescue import Rescue
from jobdeck.maintenance.rollup import STATS_SETTLE, RollUp

if TYPE_CHECKING:
    from jobdeck.store import Store

__all__ = ["STATS_SETTLE", "Maintenance", "Retention", "parse_retention"]


class Maintenance:
    """The sweeper, retention and the roll-up of one store: what each needs
    (the clock and ``stall_timeout`` the sweeper judges on, the retention
    settings) and nothing else; the statements are ``jobdeck.store.upkeep``'s."""

    def __init__(self, store: Store, clock: Clock, stall_timeout: float, retention: Retention | None = None) -> None:
        self.rescue = Rescue(store, clock, stall_timeout)
        self.prune = Prune(store, retention or Retention())
        self.rollup = RollUp(store)

    @property
    def retention(self) -> Retention:
        return self.prune.retention

    def sweep_once(self, now: datetime) -> list[int]:
        """``Rescue.sweep_once``: the ids of the jobs rescued."""
        return self.rescue.sweep_once(now)

    def prune_once(self, now: datetime) -> dict[str, int]:
        """``Prune.prune_once``: how many rows of each kind were deleted."""
        return self.prune.prune_once(now)

    def rollup_once(self, now: datetime) -> int:
        """``RollUp.rollup_once``: how many minutes were closed."""
        return self.rollup.rollup_once(now)

    def stats(self, since: datetime, job_type: str | None = None) -> list[dict[str, Any]]:
        """``RollUp.stats``: counters from ``since`` on, oldest first."""
        return self.rollup.stats(since, job_type)
