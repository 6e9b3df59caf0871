"""The tables, as SQLAlchemy Core tables: the store queries them through Core,
so nothing loads the ORM.

Importing this package defines every table on ``metadata`` (the migrations
compare against it), each module holding one family of tables."""

from __future__ import annotations

from jobdeck.store.models.columns import (
    CLAIMABLE_STATES,
    ERROR_STATES,
    FLOW_KEY_COLUMNS,
    BigID,
    UTCDateTime,
    metadata,
    status_in,
)
from jobdeck.store.models.feature_tables import (
    batches,
    demo_charges,
    demo_outbox,
    flow_closed,
    flow_starts,
    job_artifacts,
    job_dependencies,
    job_logs,
    workflows,
)
from jobdeck.store.models.job_tables import (
    CANCELLED,
    INTERRUPTED,
    OUTCOMES,
    SNOOZED,
    attempts,
    effects,
    jobs,
    workers,
)
from jobdeck.store.models.ops_tables import (
    audit_log,
    dashboard_sessions,
    maintenance_marks,
    queue_state,
    runtime_schedules,
    schedule_health,
    schedule_runs,
    schedule_state,
    stats_minutely,
    stats_totals,
    threshold_alerts,
)

__all__ = [
    "UTCDateTime",
    "BigID",
    "status_in",
    "CLAIMABLE_STATES",
    "ERROR_STATES",
    "FLOW_KEY_COLUMNS",
    "metadata",
    "INTERRUPTED",
    "CANCELLED",
    "SNOOZED",
    "OUTCOMES",
    "jobs",
    "attempts",
    "effects",
    "workers",
    "demo_outbox",
    "demo_charges",
    "schedule_state",
    "schedule_runs",
    "queue_state",
    "runtime_schedules",
    "schedule_health",
    "stats_minutely",
    "maintenance_marks",
    "stats_totals",
    "threshold_alerts",
    "audit_log",
    "dashboard_sessions",
    "job_artifacts",
    "flow_starts",
    "flow_closed",
    "job_logs",
    "workflows",
    "job_dependencies",
    "batches",
]
