"""The store: the only place that speaks SQL.

``Store`` (``lifecycle``) holds every transition of a job; the modules beside
it hold the engine, the tables, the effects ledger, the dashboard's reads,
the sessions and the migrations.
"""

from jobdeck.store.filters import filtered
from jobdeck.store.lifecycle import Backoff, Store, backoff_delay, exponential_backoff
from jobdeck.store.records import AttemptRecord, JobFilter, JobRecord, NewJob, Outcome, PoolBeat

__all__ = [
    "AttemptRecord", "Backoff", "JobFilter", "JobRecord", "NewJob", "Outcome", "PoolBeat", "Store", "backoff_delay",
    "exponential_backoff", "filtered",
]  # fmt: skip
