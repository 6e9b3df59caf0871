"""The tables. Typed SQLAlchemy models; the store queries them through Core."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from jobdeck.core.states import (
    ALL_EFFECT_STATES,
    ALL_OUTCOMES,
    ALL_STATES,
    AttemptOutcome,
    EffectState,
    State,
    Transition,
    sources,
)
from jobdeck.store.durations import COLUMNS as DURATION_COLUMNS
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    column,
    literal_column,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; UTC in the database (naive on SQLite)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use UTC-aware times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


# SQLite only makes INTEGER PRIMARY KEY the rowid; PostgreSQL gets BIGINT.
BigID = BigInteger().with_variant(Integer(), "sqlite")

_state_list = ", ".join(f"'{s.value}'" for s in ALL_STATES)
_effect_state_list = ", ".join(f"'{s.value}'" for s in ALL_EFFECT_STATES)


def status_in(status: Any, states: list[str]) -> ColumnElement[bool]:
    """``status IN ('a', 'b')`` with the states written literally, not bound:
    SQLite uses a partial index only when it can see that a WHERE implies the
    index's own, which it cannot through parameters."""
    return status.in_([literal_column(f"'{s}'") for s in states])  # type: ignore[no-any-return]


CLAIMABLE_STATES = sources(Transition.CLAIM)
"""The states a due job is claimed from; ``jobdeck.store.statements.claimable``
adds the due time. The claim indexes hold only these rows."""
_claim_index_where = status_in(column("status"), CLAIMABLE_STATES)
ERROR_STATES = [State.FAILED.value, State.DEAD.value]
"""The states whose jobs are grouped by error (``ix_jobs_error_groups`` holds only these)."""
_error_index_where = status_in(column("status"), ERROR_STATES)
_dead_where = column("status") == State.DEAD.value


FLOW_KEY_COLUMNS = ("rate_key", "concurrency_key")
_in_workflow = column("workflow_id").is_not(None)
_keyed = column("idempotency_key").is_not(None)
_unique = column("unique_key").is_not(None)
_in_batch = column("batch_id").is_not(None)


def _keyed_where(name: str) -> ColumnElement[bool]:
    return and_(status_in(column("status"), CLAIMABLE_STATES), column(name).is_not(None))


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(200))
    queue: Mapped[str] = mapped_column(String(100), default="default")
    payload: Mapped[str] = mapped_column(Text, default="{}")
    """The payload as JSON text (an object)."""
    priority: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default=State.PENDING.value)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    """Attempts started; the fencing token of the current one while running."""
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=3)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    """UNIQUE among the rows that have one (``ux_jobs_idempotency_key``, revision 0021)."""
    available_at: Mapped[datetime] = mapped_column(UTCDateTime)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[float | None] = mapped_column(Float)
    progress_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When a person or the API cancelled the job (revision 0009). A running
    job keeps running with it set: its attempt's end, however it ends, ends
    the job ``cancelled`` (``jobdeck.store.statements``)."""
    error_fingerprint: Mapped[str | None] = mapped_column(String(255))
    """The error's group (``jobdeck.core.fingerprint``), set by the fail statement;
    after cancel_requested_at (0009), last, so rows decoded by position keep their order (revision 0012)."""
    rate_key: Mapped[str | None] = mapped_column(String(255))
    """The job's key for a keyed rate limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014)."""
    concurrency_key: Mapped[str | None] = mapped_column(String(255))
    """The job's key for a keyed concurrency limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014)."""
    unique_key: Mapped[str | None] = mapped_column(String(255))
    """The unique key of a unique job (``jobdeck.jobs.unique``), UNIQUE among rows
    (``ux_jobs_unique_key``); freed by the next enqueue of the key once this
    job no longer holds it (revision 0015, after the columns before it)."""
    unique_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """The end of the key's period; NULL: no end."""
    unique_states: Mapped[int | None] = mapped_column(Integer)
    """The states the job holds its key in, a mask of ``jobdeck.core.uniqueness.STATE_BITS``."""
    workflow_id: Mapped[int | None] = mapped_column(BigID)
    """The workflow the job is a step of (``jobdeck.jobs.workflows``, revision 0020,
    after the columns before it, so rows decoded by position keep their order)."""
    batch_id: Mapped[int | None] = mapped_column(BigID)
    """The batch the job belongs to (``jobdeck.jobs.workflows.Batch``)."""
    step: Mapped[str | None] = mapped_column(String(200))
    """The job's name in its workflow, unique there (what ``depends_on`` names)."""
    deps_left: Mapped[int | None] = mapped_column(Integer)
    """Dependencies not completed yet; the completion that takes it to 0
    promotes the job from ``blocked`` to ``pending`` (``jobdeck.store.graph``)."""
    on_dependency_failure: Mapped[str | None] = mapped_column(String(8))
    """``cancel`` (the default) or ``hold``: what a dependency ending dead,
    cancelled or discarded does to this blocked job."""

    __table_args__ = (
        CheckConstraint(f"status IN ({_state_list})", name="ck_jobs_status"),
        CheckConstraint("retry_count >= 0 AND max_retries >= 0", name="ck_jobs_retries"),
        # Serves the claim: only due-able jobs are in it, in claim order.
        Index(
            "ix_jobs_claim",
            text("priority DESC"),
            "available_at",
            "id",
            sqlite_where=_claim_index_where,
            postgresql_where=_claim_index_where,
        ),
        # The claim of a pool restricted to some queues (revision 0002).
        Index(
            "ix_jobs_claim_queue",
            "queue",
            text("priority DESC"),
            "available_at",
            "id",
            sqlite_where=_claim_index_where,
            postgresql_where=_claim_index_where,
        ),
        Index("ix_jobs_status_id", "status", "id"),
        # The dashboard's type filter. Not (type, status, id): type and id
        # never change, so no transition touches this index (revision 0004
        # replaced that one, and dropped the running/worker index: running
        # jobs are few, so the status index finds them as fast).
        Index("ix_jobs_type_id", "type", "id"),
        # The errors view's GROUP BY, read from the index alone (revision 0012).
        # Partial: only failed and dead jobs are in it, so the claim and the
        # completion of a job that never failed never touch it.
        Index(
            "ix_jobs_error_groups",
            "status",
            "type",
            "error_fingerprint",
            "updated_at",
            sqlite_where=_error_index_where,
            postgresql_where=_error_index_where,
        ),
        # The overview's "died last" (revision 0013): dead jobs by when they
        # died, so its top few are read from the index, not sorted from all.
        Index("ix_jobs_dead_finished", "finished_at", "id", sqlite_where=_dead_where, postgresql_where=_dead_where),
        # The flow claim's walk key by key (revision 0014): only waiting jobs
        # with a key are in them, so a hot key's backlog is skipped in one seek.
        *(
            Index(
                f"ix_jobs_{name}",
                name,
                text("priority DESC"),
                "available_at",
                "id",
                sqlite_where=_keyed_where(name),
                postgresql_where=_keyed_where(name),
            )
            for name in FLOW_KEY_COLUMNS
        ),
        # Idempotency keys and unique jobs (revision 0015): the database decides
        # between racing enqueues. Partial (revision 0021): a job without a key
        # adds no entry, so a plain enqueue writes two index entries fewer; the
        # enqueue's ON CONFLICT names the same predicate (``jobdeck.store.statements``).
        Index("ux_jobs_idempotency_key", "idempotency_key", unique=True, sqlite_where=_keyed, postgresql_where=_keyed),
        Index("ux_jobs_unique_key", "unique_key", unique=True, sqlite_where=_unique, postgresql_where=_unique),
        # A workflow's jobs and a batch's (revision 0020): plain jobs are in neither.
        Index("ix_jobs_workflow", "workflow_id", "id", sqlite_where=_in_workflow, postgresql_where=_in_workflow),
        Index("ix_jobs_batch", "batch_id", "status", sqlite_where=_in_batch, postgresql_where=_in_batch),
        {"sqlite_autoincrement": True},
    )


INTERRUPTED = AttemptOutcome.INTERRUPTED.value
"""The outcome of an attempt that shutdown cut short (``jobdeck.core.states.AttemptOutcome``)."""
CANCELLED = AttemptOutcome.CANCELLED.value
"""The outcome of an attempt whose job a person cancelled while it ran."""
SNOOZED = AttemptOutcome.SNOOZED.value
"""The outcome of an attempt whose handler snoozed its job (``jobdeck.jobs.snooze``)."""

OUTCOMES = tuple(o.value for o in ALL_OUTCOMES)
"""How an attempt can end (``attempts.outcome``)."""


class Attempt(Base):
    """One row per finished attempt: the job's whole failure history."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[str | None] = mapped_column(Text)
    """The payload this attempt ran with, kept only when it differs later
    (edit and retry); NULL means the job's current payload."""
    snooze_seconds: Mapped[float | None] = mapped_column(Float)
    """How long a ``snoozed`` attempt put its job off (revision 0016); NULL otherwise."""

    __table_args__ = (
        CheckConstraint(f"outcome IN ({', '.join(repr(o) for o in OUTCOMES)})", name="ck_attempts_outcome"),
        Index("ix_attempts_job", "job_id", "attempt"),
    )


class Effect(Base):
    """The effects ledger: one row per irreversible side effect, keyed by
    the handler's key, recorded ``started`` before the effect and ``done``
    with its result after it (``jobdeck.core.states.EffectState``)."""

    __tablename__ = "effects"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigID)
    attempt: Mapped[int | None] = mapped_column(Integer)
    """The attempt that started the effect (and, when done, performed it)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """When the key was first recorded."""
    state: Mapped[str] = mapped_column(
        String(16), default=EffectState.DONE.value, server_default=EffectState.DONE.value
    )
    """Rows from before the two-phase ledger were recorded and then performed
    in one step: they read as done (revision 0005)."""
    worker_id: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the current attempt started it (a replay or a retry after
    not-performed moves it)."""
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When it became done or not performed."""
    result: Mapped[str | None] = mapped_column(Text)
    """What the effect's function returned, as JSON text."""
    resolved_by: Mapped[str | None] = mapped_column(String(200))
    """The person who marked an unknown effect done or not performed."""

    __table_args__ = (
        CheckConstraint(f"state IN ({_effect_state_list})", name="ck_effects_state"),
        Index("ix_effects_job", "job_id"),
    )


class Worker(Base):
    """A live worker pool (one per process)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    threads: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    gone_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Set by the sweeper when the worker stopped heart-beating without stopping."""
    abandoned_threads: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Handler threads the pool abandoned after a timeout that are still running."""
    unhealthy: Mapped[str | None] = mapped_column(Text)
    """Why the pool reports itself unhealthy (and claims nothing); None when healthy.
    Stored so that every process's dashboard shows every pool's health."""
    queues: Mapped[str | None] = mapped_column(Text)
    """The queues the pool claims from, as a JSON list; None for every queue
    (revision 0019: the "no live workers for a queue" threshold reads it)."""
    clock_offset: Mapped[float | None] = mapped_column(Float)
    """Seconds the database's clock was ahead of this process's host clock at
    its last measurement (``jobdeck.core.clock``); None on SQLite (revision 0024)."""
    late_beat_seconds: Mapped[float | None] = mapped_column(Float)
    """The last late heartbeat: seconds since the beat before it had landed
    (``jobdeck.worker.leasing``); None while none was late (revision 0025)."""
    late_beat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When that late heartbeat landed."""


jobs = cast(Table, Job.__table__)
attempts = cast(Table, Attempt.__table__)
effects = cast(Table, Effect.__table__)
workers = cast(Table, Worker.__table__)


class DemoOutbox(Base):
    """Where ``demo.send-email`` writes its messages (demo only)."""

    __tablename__ = "demo_outbox"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(100))
    job_id: Mapped[int | None] = mapped_column(BigID)
    body: Mapped[str] = mapped_column(Text)
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DemoCharge(Base):
    """The fake payment gateway's ledger: every charge it ever made, so a
    double charge would be visible. A charge made with an idempotency key
    is made once per key, as real gateways do (NULL keys never collide)."""

    __tablename__ = "demo_charges"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(100))
    amount_cents: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(BigID)
    charged_at: Mapped[datetime] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (UniqueConstraint("idempotency_key", name="uq_demo_charges_idempotency_key"),)


demo_outbox = cast(Table, DemoOutbox.__table__)
demo_charges = cast(Table, DemoCharge.__table__)


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

# The stats roll-up and the overview's throughput chart read attempts by finish time.
Index("ix_attempts_finished", attempts.c.finished_at)


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


class JobArtifact(Base):
    """A file a handler kept for people to download (``ctx.artifact``): a
    report, an export. One per job and name, so a later attempt storing the
    same name replaces the earlier attempt's; it goes with its job (the
    foreign key cascades, and retention deletes it explicitly too)."""

    __tablename__ = "job_artifacts"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    """The attempt that stored the current bytes."""
    name: Mapped[str] = mapped_column(String(255))
    """The download's file name (checked by ``jobdeck.jobs.artifacts.check_name``)."""
    content_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("job_id", "name", name="uq_job_artifacts_name"),)


job_artifacts = cast(Table, JobArtifact.__table__)


class FlowStart(Base):
    """One start of a rate-limited job: the sliding window log of ``jobdeck.jobs.flow``
    (revision 0014). The claims prune rows older than their window."""

    __tablename__ = "flow_starts"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    limit_name: Mapped[str] = mapped_column(String(320))
    """``type:T`` or ``queue:Q``."""
    key: Mapped[str] = mapped_column(String(255))
    """The job's key, or "" for an unkeyed limit."""
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    count: Mapped[int] = mapped_column(Integer, default=1)
    """Starts of this limit and key at this time: one claim's are one row."""

    __table_args__ = (Index("ix_flow_starts_window", "limit_name", "key", "started_at"),)


flow_starts = cast(Table, FlowStart.__table__)


class FlowClosed(Base):
    """A rate limit a handler closed (``ctx.rate_limited``) until a time (revision 0014)."""

    __tablename__ = "flow_closed"

    limit_name: Mapped[str] = mapped_column(String(320), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    until: Mapped[datetime] = mapped_column(UTCDateTime)
    job_id: Mapped[int | None] = mapped_column(BigID)
    """The job whose handler closed it."""


flow_closed = cast(Table, FlowClosed.__table__)


class JobLogLine(Base):
    """One line a handler logged (``ctx.log``, captured ``logging`` calls, an
    HTTP worker's heartbeat), kept per attempt. ``level`` is one of
    ``jobdeck.jobs.joblogs.LEVELS`` or ``truncated``: the one marker an attempt gets
    when its lines went past ``[logs]``'s caps. It goes with its job (the
    foreign key cascades, and retention deletes it explicitly too)."""

    __tablename__ = "job_logs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    """The order lines are read in (the live poll's cursor)."""
    job_id: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    """The line's number in its attempt, from 1."""
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    level: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(Integer)
    """The message's UTF-8 bytes: what ``max_bytes_per_job`` adds up."""

    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "seq", name="uq_job_logs_line"),
        Index("ix_job_logs_job", "job_id", "id"),
    )


job_logs = cast(Table, JobLogLine.__table__)


class Workflow(Base):
    """One enqueued graph of jobs (``jobdeck.jobs.workflows``, revision 0020). Its
    jobs carry ``workflow_id``; its edges are ``job_dependencies``. Its state
    is read from its jobs', and retention deletes it with them."""

    __tablename__ = "workflows"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    key: Mapped[str | None] = mapped_column(String(255))
    """Makes an enqueue happen once (a schedule's fire time): a second with
    the same key returns the first workflow."""
    on_dependency_failure: Mapped[str] = mapped_column(String(8))
    """The workflow's default for its jobs' ``on_dependency_failure``."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("key", name="uq_workflows_key"),
        Index("ix_workflows_name", "name", "id"),
        {"sqlite_autoincrement": True},
    )


workflows = cast(Table, Workflow.__table__)


class JobDependency(Base):
    """One edge of a workflow: ``job_id`` waits for ``depends_on`` to complete."""

    __tablename__ = "job_dependencies"

    job_id: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    depends_on: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)

    __table_args__ = (Index("ix_job_dependencies_on", "depends_on"),)


job_dependencies = cast(Table, JobDependency.__table__)


class Batch(Base):
    """Jobs grouped for one callback (``jobdeck.jobs.workflows.Batch``, revision 0020).
    Open until closed; once closed and every job of it has ended, the
    transaction that ends the last one enqueues the callbacks and stamps
    ``fired_at``, once."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    name: Mapped[str | None] = mapped_column(String(200))
    callbacks: Mapped[str] = mapped_column(Text)
    """JSON: ``{"on_complete": {"type", "payload", "queue"}, ...}``."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(Text)
    """JSON, when fired: the counts by state and the callback jobs' ids."""

    __table_args__ = ({"sqlite_autoincrement": True},)


batches = cast(Table, Batch.__table__)
