"""The tables that keep the deployment running: schedules and their runs,
paused queues, per-minute and all-time counters, maintenance marks,
threshold alerts, the audit log and dashboard sessions."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from jobdeck.store.durations import COLUMNS as DURATION_COLUMNS
from jobdeck.store.models.columns import (
    Base,
    BigID,
    UTCDateTime,
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
from sqlalchemy.orm import Mapped, mapped_column

# -- schedules, queue controls, maintenance (issue 3) -------------------------


class ScheduleState(Base):
    """What the database knows of a schedule (from config or runtime): the operator's
    pause flag and the watermark up to which fire times were enqueued. The row
    outlives the schedule's removal from config, so its history stays."""

    __tablename__ = "schedule_state"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    checked_until: Mapped[datetime] = mapped_column(UTCDateTime)
    """Every fire time up to here has been enqueued (or skipped by policy)."""
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ScheduleRun(Base):
    """One firing of a schedule (or a ``Run now``) and the job it enqueued."""

    __tablename__ = "schedule_runs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    schedule: Mapped[str] = mapped_column(String(200))
    fire_time: Mapped[datetime] = mapped_column(UTCDateTime)
    job_id: Mapped[int | None] = mapped_column(BigID)
    manual: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("schedule", "fire_time", name="uq_schedule_runs_fire"),
        Index("ix_schedule_runs_recent", "schedule", "id"),
    )


class RuntimeSchedule(Base):
    """A schedule an operator made at runtime (dashboard or API), kept as the
    same table a ``[[schedules]]`` entry is, so every process parses it with
    ``parse_schedule`` and fires it through the same ``fire_key``. A config
    schedule's name is never stored here."""

    __tablename__ = "runtime_schedules"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    definition: Mapped[str] = mapped_column(Text)
    """The entry as JSON, in config form (``cron``, ``type``, ``payload``, ...)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_by: Mapped[str] = mapped_column(String(200))


class ScheduleHealthRow(Base):
    """The dead man's switch of one watched schedule (``expect_success_within``,
    ``alert_after_failures``): since when it is watched, its last success, and
    whether it is unhealthy. ``unhealthy`` flips by conditional UPDATE, so of
    several processes checking at once one records each alert and recovery."""

    __tablename__ = "schedule_health"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    watched_since: Mapped[datetime] = mapped_column(UTCDateTime)
    last_success_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    unhealthy: Mapped[bool] = mapped_column(Boolean, default=False)
    episode: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """While unhealthy: the success (or the start of watching) it is counted from."""
    reason: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class QueueState(Base):
    """A queue an operator paused: paused queues are not claimed from."""

    __tablename__ = "queue_state"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StatsMinute(Base):
    """Per-minute outcome counters by job type, rolled up from attempts so
    the dashboard's charts survive restarts and retention; kept 30 days."""

    __tablename__ = "stats_minutely"

    minute: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    type: Mapped[str] = mapped_column(String(200), primary_key=True)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    dead: Mapped[int] = mapped_column(Integer, default=0)
    # dur_00 ... dur_47: attempts that ran that long, by bucket (added below, revision 0011).


class MaintenanceMark(Base):
    """Watermarks of the maintenance loops (e.g. the last rolled-up minute),
    advanced by compare-and-set so concurrent processes do the work once."""

    __tablename__ = "maintenance_marks"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[datetime] = mapped_column(UTCDateTime)


schedule_state = cast(Table, ScheduleState.__table__)
schedule_runs = cast(Table, ScheduleRun.__table__)
queue_state = cast(Table, QueueState.__table__)
runtime_schedules = cast(Table, RuntimeSchedule.__table__)
schedule_health = cast(Table, ScheduleHealthRow.__table__)
stats_minutely = cast(Table, StatsMinute.__table__)
for _bucket in DURATION_COLUMNS:
    # One counter per run-time bucket (``jobdeck.store.durations``); columns
    # rather than mapped attributes, since the store reads them through Core.
    stats_minutely.append_column(Column(_bucket, Integer, nullable=False, default=0, server_default="0"))
maintenance_marks = cast(Table, MaintenanceMark.__table__)


class StatsTotal(Base):
    """All-time sums of ``stats_minutely`` per job type (revision 0019): the
    roll-up adds to both in one transaction and retention prunes only the
    minutes, so the Prometheus counters read from here never go down."""

    __tablename__ = "stats_totals"

    type: Mapped[str] = mapped_column(String(200), primary_key=True)
    completed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    failed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    dead: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


stats_totals = cast(Table, StatsTotal.__table__)
for _bucket in DURATION_COLUMNS:
    stats_totals.append_column(Column(_bucket, BigInteger, nullable=False, default=0, server_default="0"))


class ThresholdAlert(Base):
    """Whether one threshold alert (``jobdeck.maintenance.thresholds``) is firing,
    moved by compare-and-set on ``firing`` so exactly one process sends each
    start and each recovery (revision 0019)."""

    __tablename__ = "threshold_alerts"

    key: Mapped[str] = mapped_column(String(400), primary_key=True)
    """``<kind>:<subject>``, e.g. ``queue_latency:reports``."""
    firing: Mapped[bool] = mapped_column(Boolean)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    value: Mapped[float | None] = mapped_column(Float)
    """The measured value at the last change (seconds, a rate, a count)."""


threshold_alerts = cast(Table, ThresholdAlert.__table__)


_bulk_where = column("total").is_not(None)


class AuditEntry(Base):
    """One operator action taken in the dashboard: who, when, what, on how
    many jobs. A bulk action over a filter is one entry whose ``count`` grows
    batch by batch, so an interrupted bulk action still says how far it got."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(40))
    job_id: Mapped[int | None] = mapped_column(BigID)
    """The job acted on, for single-job actions."""
    count: Mapped[int] = mapped_column(Integer, default=0)
    """Jobs the action actually moved (refused ones are not counted). A bulk
    action's batches add to it in their own transactions (``jobdeck.store.audit``)."""
    detail: Mapped[str | None] = mapped_column(Text)
    total: Mapped[int | None] = mapped_column(BigInteger)
    """A bulk action's jobs to move, counted as it began; NULL for other actions."""
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When a bulk action's last batch committed; NULL while running or once cut short."""
    owner: Mapped[str | None] = mapped_column(String(200))
    """The process that moved a bulk action's last batch (``jobdeck.core.processes.identity``)."""
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When a bulk action's last batch committed (or it began)."""

    __table_args__ = (
        Index("ix_audit_log_job", "job_id", "id"),
        # A person's latest bulk action, for the job lists' "interrupted" notice (revision 0024).
        Index("ix_audit_log_bulk", "actor", "id", sqlite_where=_bulk_where, postgresql_where=_bulk_where),
    )


audit_log = cast(Table, AuditEntry.__table__)


class DashboardSession(Base):
    """A signed-in dashboard session. The cookie carries a random token and
    this row holds its SHA-256, so logging out (deleting the row) ends the
    session in every process sharing the database, and a copied cookie stops
    working; a leaked table gives no usable cookie."""

    __tablename__ = "dashboard_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 (hex) of the token in the session cookie."""
    user_name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    credential: Mapped[str | None] = mapped_column(String(64))
    """The fingerprint of the user's password hash and role at login
    (``jobdeck.web.dashboard.settings.User.credential``): a session whose user
    has since been given another password or role no longer matches, and
    is refused in every process running the new config."""

    __table_args__ = (Index("ix_dashboard_sessions_created", "created_at"),)


dashboard_sessions = cast(Table, DashboardSession.__table__)
