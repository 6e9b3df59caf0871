"""The per-minute counters the dashboard's charts and the threshold alerts
read: each minute's attempts are rolled up into ``stats_minutely`` once the
minute has settled."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.store.upkeep import roll_up_minutes, stats_since, whole_minute

if TYPE_CHECKING:
    from jobdeck.store import Store

STATS_SETTLE = timedelta(seconds=30)
"""A minute is rolled up this long after it ends, so late acks land in it."""


class RollUp:
    """The roll-up of one store's attempts into per-minute counters."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def rollup_once(self, now: datetime) -> int:
        """Close the minutes that ended at least ``STATS_SETTLE`` ago into
        ``stats_minutely``; returns how many minutes were closed."""
        return roll_up_minutes(self.store, whole_minute(now - STATS_SETTLE))

    def stats(self, since: datetime, job_type: str | None = None) -> list[dict[str, Any]]:
        """Counters from ``since`` on, oldest first (for the dashboard's charts)."""
        return stats_since(self.store, since, job_type)
