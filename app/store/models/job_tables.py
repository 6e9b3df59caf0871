"""The job's own tables: the jobs, their attempts, the effects ledger and the
workers that run them, with the partial indexes the claim and the lists use."""

from __future__ import annotations

from jobdeck.core.states import (
    ALL_EFFECT_STATES,
    ALL_OUTCOMES,
    ALL_STATES,
    AttemptOutcome,
    EffectState,
    State,
)
from jobdeck.store.models.columns import (
    CLAIMABLE_STATES,
    ERROR_STATES,
    FLOW_KEY_COLUMNS,
    BigID,
    UTCDateTime,
    metadata,
    status_in,
)
from sqlalchemy import (
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    column,
    text,
)
from sqlalchemy.sql.elements import ColumnElement

_state_list = ", ".join(f"'{s.value}'" for s in ALL_STATES)
_effect_state_list = ", ".join(f"'{s.value}'" for s in ALL_EFFECT_STATES)
_claim_index_where = status_in(column("status"), CLAIMABLE_STATES)
_error_index_where = status_in(column("status"), ERROR_STATES)
_dead_where = column("status") == State.DEAD.value
_in_workflow = column("workflow_id").is_not(None)
_keyed = column("idempotency_key").is_not(None)
_unique = column("unique_key").is_not(None)
_in_batch = column("batch_id").is_not(None)


def _keyed_where(name: str) -> ColumnElement[bool]:
    return and_(status_in(column("status"), CLAIMABLE_STATES), column(name).is_not(None))


jobs = Table(
    "jobs",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("type", String(200), nullable=False),
    Column("queue", String(100), nullable=False, default="default"),
    # The payload as JSON text (an object).
    Column("payload", Text, nullable=False, default="{}"),
    Column("priority", Integer, nullable=False, default=0),
    Column("status", String(16), nullable=False, default=State.PENDING.value),
    # Attempts started; the fencing token of the current one while running.
    Column("attempt", Integer, nullable=False, default=0),
    Column("retry_count", Integer, nullable=False, default=0),
    Column("max_retries", Integer, nullable=False, default=3),
    # UNIQUE among the rows that have one (``ux_jobs_idempotency_key``, revision 0021).
    Column("idempotency_key", String(255)),
    Column("available_at", UTCDateTime, nullable=False),
    Column("claimed_at", UTCDateTime),
    Column("heartbeat_at", UTCDateTime),
    Column("worker_id", String(200)),
    Column("error", Text),
    Column("result", Text),
    Column("progress", Float),
    Column("progress_message", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    # When a person or the API cancelled the job (revision 0009). A running
    # job keeps running with it set: its attempt's end, however it ends, ends
    # the job ``cancelled`` (``jobdeck.store.statements``).
    Column("cancel_requested_at", UTCDateTime),
    # The error's group (``jobdeck.core.fingerprint``), set by the fail statement;
    # after cancel_requested_at (0009), last, so rows decoded by position keep their order (revision 0012).
    Column("error_fingerprint", String(255)),
    # The job's key for a keyed rate limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014).
    Column("rate_key", String(255)),
    # The job's key for a keyed concurrency limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014).
    Column("concurrency_key", String(255)),
    # The unique key of a unique job (``jobdeck.jobs.unique``), UNIQUE among rows
    # (``ux_jobs_unique_key``); freed by the next enqueue of the key once this
    # job no longer holds it (revision 0015, after the columns before it).
    Column("unique_key", String(255)),
    # The end of the key's period; NULL: no end.
    Column("unique_until", UTCDateTime),
    # The states the job holds its key in, a mask of ``jobdeck.core.uniqueness.STATE_BITS``.
    Column("unique_states", Integer),
    # The workflow the job is a step of (``jobdeck.jobs.workflows``, revision 0020,
    # after the columns before it, so rows decoded by position keep their order).
    Column("workflow_id", BigID),
    # The batch the job belongs to (``jobdeck.jobs.workflows.Batch``).
    Column("batch_id", BigID),
    # The job's name in its workflow, unique there (what ``depends_on`` names).
    Column("step", String(200)),
    # Dependencies not completed yet; the completion that takes it to 0
    # promotes the job from ``blocked`` to ``pending`` (``jobdeck.store.graph``).
    Column("deps_left", Integer),
    # ``cancel`` (the default) or ``hold``: what a dependency ending dead,
    # cancelled or discarded does to this blocked job.
    Column("on_dependency_failure", String(8)),
    # When the job first failed with the error it holds (its
    # ``error_fingerprint``), set by the fail statement and kept while its
    # failures keep that fingerprint, across retries (a person's too): the
    # Errors page's "First seen" of a group is the earliest of its jobs'
    # (revision 0026, so rows decoded by position keep their order).
    Column("error_since", UTCDateTime),
    # The W3C trace context current when the job was enqueued, with tracing
    # on (``jobdeck.tracing``): each attempt's span is its child (revision
    # 0027, last, so rows decoded by position keep their order).
    Column("traceparent", String(55)),
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
    # The errors view's GROUP BY, read from the index alone (revision 0012;
    # error_since since 0026). Partial: only failed and dead jobs are in
    # it, so the claim and the completion of a job that never failed never
    # touch it.
    Index(
        "ix_jobs_error_groups",
        "status",
        "type",
        "error_fingerprint",
        "updated_at",
        "error_since",
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
    sqlite_autoincrement=True,
)


INTERRUPTED = AttemptOutcome.INTERRUPTED.value
"""The outcome of an attempt that shutdown cut short (``jobdeck.core.states.AttemptOutcome``)."""
CANCELLED = AttemptOutcome.CANCELLED.value
"""The outcome of an attempt whose job a person cancelled while it ran."""
SNOOZED = AttemptOutcome.SNOOZED.value
"""The outcome of an attempt whose handler snoozed its job (``jobdeck.jobs.snooze``)."""

OUTCOMES = tuple(o.value for o in ALL_OUTCOMES)
"""How an attempt can end (``attempts.outcome``)."""


# One row per finished attempt: the job's whole failure history.
attempts = Table(
    "attempts",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("job_id", BigID, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", String(200)),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("outcome", String(16), nullable=False),
    Column("error", Text),
    Column("traceback", Text),
    # The payload this attempt ran with, kept only when it differs later
    # (edit and retry); NULL means the job's current payload.
    Column("payload", Text),
    # How long a ``snoozed`` attempt put its job off (revision 0016); NULL otherwise.
    Column("snooze_seconds", Float),
    # What ran it: "thread", "async" or "process" (revision 0030); NULL for an
    # attempt the pool did not finish itself (released, rescued) or older ones.
    Column("executor", String(16)),
    CheckConstraint(f"outcome IN ({', '.join(repr(o) for o in OUTCOMES)})", name="ck_attempts_outcome"),
    Index("ix_attempts_job", "job_id", "attempt"),
    # The stats roll-up and the overview's throughput chart read attempts by finish time.
    Index("ix_attempts_finished", "finished_at"),
)


# The effects ledger: one row per irreversible side effect, keyed by
# the handler's key, recorded ``started`` before the effect and ``done``
# with its result after it (``jobdeck.core.states.EffectState``).
effects = Table(
    "effects",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("job_id", BigID),
    # The attempt that started the effect (and, when done, performed it).
    Column("attempt", Integer),
    # When the key was first recorded.
    Column("created_at", UTCDateTime, nullable=False),
    # Rows from before the two-phase ledger were recorded and then performed
    # in one step: they read as done (revision 0005).
    Column(
        "state",
        String(16),
        nullable=False,
        default=EffectState.DONE.value,
        server_default=EffectState.DONE.value,
    ),
    Column("worker_id", String(200)),
    # When the current attempt started it (a replay or a retry after
    # not-performed moves it).
    Column("started_at", UTCDateTime),
    # When it became done or not performed.
    Column("finished_at", UTCDateTime),
    # What the effect's function returned, as JSON text.
    Column("result", Text),
    # The person who marked an unknown effect done or not performed.
    Column("resolved_by", String(200)),
    CheckConstraint(f"state IN ({_effect_state_list})", name="ck_effects_state"),
    Index("ix_effects_job", "job_id"),
)


# A live worker pool (one per process).
workers = Table(
    "workers",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("threads", Integer, nullable=False, default=0),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("stopped_at", UTCDateTime),
    # Set by the sweeper when the worker stopped heart-beating without stopping.
    Column("gone_at", UTCDateTime),
    # Handler threads the pool abandoned after a timeout that are still running.
    Column("abandoned_threads", Integer, nullable=False, default=0, server_default="0"),
    # Why the pool reports itself unhealthy (and claims nothing); None when healthy.
    # Stored so that every process's dashboard shows every pool's health.
    Column("unhealthy", Text),
    # The queues the pool claims from, as a JSON list; None for every queue
    # (revision 0019: the "no live workers for a queue" threshold reads it).
    Column("queues", Text),
    # Seconds the database's clock was ahead of this process's host clock at
    # its last measurement (``jobdeck.core.clock``); None on SQLite (revision 0024).
    Column("clock_offset", Float),
    # The last late heartbeat: seconds since the beat before it had landed
    # (``jobdeck.worker.leasing``); None while none was late (revision 0025).
    Column("late_beat_seconds", Float),
    # When that late heartbeat landed.
    Column("late_beat_at", UTCDateTime),
    # The last time the pool's event loop of async handlers was held by a
    # blocking call (``jobdeck.worker.async_loop``): for how long; None while
    # never (revision 0028).
    Column("loop_held_seconds", Float),
    Column("loop_held_at", UTCDateTime),
    # The job whose handler held it, and its type (None: no task's step held it).
    Column("loop_held_job", Integer),
    Column("loop_held_type", String(200)),
    # What each executor of the pool holds, as JSON (``jobdeck.worker.pool.WorkerPool.executors_now``):
    # capacity and busy slots, the process pool's children and restarts; None before the first (revision 0029).
    Column("executors", Text),
)
