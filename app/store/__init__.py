"""The store: the only place that speaks SQL.

``Store`` (``lifecycle``) holds every transition of a job; the modules beside
it hold the engine, the tables, the effects ledger, the dashboard's reads,
the sessions and the migrations.

Each name is loaded on first use, like ``jobdeck``'s own: importing one of
the modules beside it (the ledger's records, the fault rules) does not load
SQLAlchemy and the tables with ``Store``, so a process executor's child,
which never touches the database, starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobdeck.core.lazy import lazy_names

if TYPE_CHECKING:
    from jobdeck.store.filters import filtered
    from jobdeck.store.lifecycle import Backoff, Store, backoff_delay, exponential_backoff
    from jobdeck.store.records import AttemptRecord, JobFilter, JobRecord, NewJob, Outcome, PoolBeat

__all__ = [
    "AttemptRecord", "Backoff", "JobFilter", "JobRecord", "NewJob", "Outcome", "PoolBeat", "Store", "backoff_delay",
    "exponential_backoff", "filtered",
]  # fmt: skip

_HOMES = {
    "filtered": "jobdeck.store.filters",
    "Backoff": "jobdeck.store.lifecycle",
    "Store": "jobdeck.store.lifecycle",
    "backoff_delay": "jobdeck.store.lifecycle",
    "exponential_backoff": "jobdeck.store.lifecycle",
    "AttemptRecord": "jobdeck.store.records",
    "JobFilter": "jobdeck.store.records",
    "JobRecord": "jobdeck.store.records",
    "NewJob": "jobdeck.store.records",
    "Outcome": "jobdeck.store.records",
    "PoolBeat": "jobdeck.store.records",
}


__getattr__ = lazy_names(__name__, _HOMES)
