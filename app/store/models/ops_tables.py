"""The tables that keep the deployment running: schedules and their runs,
paused queues, per-minute and all-time counters, maintenance marks,
threshold alerts, the audit log and dashboard sessions."""

from __future__ import annotations

from jobdeck.store.durations import COLUMNS as DURATION_COLUMNS
from jobdeck.store.models.columns import (
    BigID,
    UTCDateTime,
    metadata,
)
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    column,
)

# -- schedules, queue controls, maintenance (issue 3) -------------------------

# What the database knows of a schedule (from config or runtime): the operator's
# pause flag and the watermark up to which fire times were enqueued. The row
# outlives the schedule's removal from config, so its history stays.
schedule_state = Table(
    "schedule_state",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("paused", Boolean, nullable=False, default=False),
    # Every fire time up to here has been enqueued (or skipped by policy).
    Column("checked_until", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)


# One firing of a schedule (or a ``Run now``) and the job it enqueued.
schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("schedule", String(200), nullable=False),
    Column("fire_time", UTCDateTime, nullable=False),
    Column("job_id", BigID),
    Column("manual", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("schedule", "fire_time", name="uq_schedule_runs_fire"),
    Index("ix_schedule_runs_recent", "schedule", "id"),
)


# A schedule an operator made at runtime (dashboard or API), kept as the
# same table a ``[[schedules]]`` entry is, so every process parses it with
# ``parse_schedule`` and fires it through the same ``fire_key``. A config
# schedule's name is never stored here.
runtime_schedules = Table(
    "runtime_schedules",
    metadata,
    Column("name", String(200), primary_key=True),
    # The entry as JSON, in config form (``cron``, ``type``, ``payload``, ...).
    Column("definition", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("updated_by", String(200), nullable=False),
)


# The dead man's switch of one watched schedule (``expect_success_within``,
# ``alert_after_failures``): since when it is watched, its last success, and
# whether it is unhealthy. ``unhealthy`` flips by conditional UPDATE, so of
# several processes checking at once one records each alert and recovery.
schedule_health = Table(
    "schedule_health",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("watched_since", UTCDateTime, nullable=False),
    Column("last_success_at", UTCDateTime),
    Column("unhealthy", Boolean, nullable=False, default=False),
    # While unhealthy: the success (or the start of watching) it is counted from.
    Column("episode", UTCDateTime),
    Column("reason", Text),
    Column("changed_at", UTCDateTime),
)


# A queue an operator paused: paused queues are not claimed from.
queue_state = Table(
    "queue_state",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("paused", Boolean, nullable=False, default=False),
    Column("updated_at", UTCDateTime, nullable=False),
)


# Per-minute outcome counters by job type, rolled up from attempts so
# the dashboard's charts survive restarts and retention; kept 30 days.
stats_minutely = Table(
    "stats_minutely",
    metadata,
    Column("minute", UTCDateTime, primary_key=True),
    Column("type", String(200), primary_key=True),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("dead", Integer, nullable=False, default=0),
    # dur_00 ... dur_47: attempts that ran that long, by bucket (``jobdeck.store.durations``, revision 0011).
    *(Column(bucket, Integer, nullable=False, default=0, server_default="0") for bucket in DURATION_COLUMNS),
)


# Watermarks of the maintenance loops (e.g. the last rolled-up minute),
# advanced by compare-and-set so concurrent processes do the work once.
maintenance_marks = Table(
    "maintenance_marks",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", UTCDateTime, nullable=False),
)


# All-time sums of ``stats_minutely`` per job type (revision 0019): the
# roll-up adds to both in one transaction and retention prunes only the
# minutes, so the Prometheus counters read from here never go down.
stats_totals = Table(
    "stats_totals",
    metadata,
    Column("type", String(200), primary_key=True),
    Column("completed", BigInteger, nullable=False, default=0, server_default="0"),
    Column("failed", BigInteger, nullable=False, default=0, server_default="0"),
    Column("dead", BigInteger, nullable=False, default=0, server_default="0"),
    *(Column(bucket, BigInteger, nullable=False, default=0, server_default="0") for bucket in DURATION_COLUMNS),
)


# Whether one threshold alert (``jobdeck.maintenance.thresholds``) is firing,
# moved by compare-and-set on ``firing`` so exactly one process sends each
# start and each recovery (revision 0019).
threshold_alerts = Table(
    "threshold_alerts",
    metadata,
    # ``<kind>:<subject>``, e.g. ``queue_latency:reports``.
    Column("key", String(400), primary_key=True),
    Column("firing", Boolean, nullable=False),
    Column("changed_at", UTCDateTime, nullable=False),
    # The measured value at the last change (seconds, a rate, a count).
    Column("value", Float),
)


_bulk_where = column("total").is_not(None)

# One operator action taken in the dashboard: who, when, what, on how
# many jobs. A bulk action over a filter is one entry whose ``count`` grows
# batch by batch, so an interrupted bulk action still says how far it got.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("action", String(40), nullable=False),
    # The job acted on, for single-job actions.
    Column("job_id", BigID),
    # Jobs the action actually moved (refused ones are not counted). A bulk
    # action's batches add to it in their own transactions (``jobdeck.store.audit``).
    Column("count", Integer, nullable=False, default=0),
    Column("detail", Text),
    # A bulk action's jobs to move, counted as it began; NULL for other actions.
    Column("total", BigInteger),
    # When a bulk action's last batch committed; NULL while running or once cut short.
    Column("finished_at", UTCDateTime),
    # The process that moved a bulk action's last batch (``jobdeck.core.processes.identity``).
    Column("owner", String(200)),
    # When a bulk action's last batch committed (or it began).
    Column("updated_at", UTCDateTime),
    Index("ix_audit_log_job", "job_id", "id"),
    # A person's latest bulk action, for the job lists' "interrupted" notice (revision 0024).
    Index("ix_audit_log_bulk", "actor", "id", sqlite_where=_bulk_where, postgresql_where=_bulk_where),
)


# A signed-in dashboard session. The cookie carries a random token and
# this row holds its SHA-256, so logging out (deleting the row) ends the
# session in every process sharing the database, and a copied cookie stops
# working; a leaked table gives no usable cookie.
dashboard_sessions = Table(
    "dashboard_sessions",
    metadata,
    # SHA-256 (hex) of the token in the session cookie.
    Column("id", String(64), primary_key=True),
    Column("user_name", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # The fingerprint of the user's password hash and role at login
    # (``jobdeck.web.dashboard.settings.User.credential``): a session whose user
    # has since been given another password or role no longer matches, and
    # is refused in every process running the new config.
    Column("credential", String(64)),
    Index("ix_dashboard_sessions_created", "created_at"),
)
