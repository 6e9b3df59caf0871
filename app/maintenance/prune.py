"""Retention (after Oban's Pruner): finished jobs past their age, with their
attempts and workflows, old per-minute counters and long-gone workers are
deleted in short batches.

``[retention]`` in config::

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

from jobdeck.core.config import Config, ConfigError
from jobdeck.core.states import ENDED, FINISHED, State
from jobdeck.store.upkeep import prune_finished, prune_stats, prune_workers, prune_workflows

if TYPE_CHECKING:
    from jobdeck.store import Store

log = logging.getLogger("jobdeck.maintenance")


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


class Prune:
    """Retention over one store, with its settings."""

    def __init__(self, store: Store, retention: Retention) -> None:
        self.store = store
        self.retention = retention

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
