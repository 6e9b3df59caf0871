"""The tables of what a job may do (artifacts, flow limits, logs, workflows
and batches) and the demo's two tables."""

from __future__ import annotations

from jobdeck.store.models.columns import (
    BigID,
    UTCDateTime,
    metadata,
)
from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

# Where ``demo.send-email`` writes its messages (demo only).
demo_outbox = Table(
    "demo_outbox",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("user_id", String(100), nullable=False),
    Column("job_id", BigID),
    Column("body", Text, nullable=False),
    Column("sent_at", UTCDateTime, nullable=False),
)


# The fake payment gateway's ledger: every charge it ever made, so a
# double charge would be visible. A charge made with an idempotency key
# is made once per key, as real gateways do (NULL keys never collide).
demo_charges = Table(
    "demo_charges",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("order_id", String(100), nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("job_id", BigID),
    Column("charged_at", UTCDateTime, nullable=False),
    Column("idempotency_key", String(255)),
    UniqueConstraint("idempotency_key", name="uq_demo_charges_idempotency_key"),
)


# A file a handler kept for people to download (``ctx.artifact``): a
# report, an export. One per job and name, so a later attempt storing the
# same name replaces the earlier attempt's; it goes with its job (the
# foreign key cascades, and retention deletes it explicitly too).
job_artifacts = Table(
    "job_artifacts",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("job_id", BigID, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    # The attempt that stored the current bytes.
    Column("attempt", Integer, nullable=False),
    # The download's file name (checked by ``jobdeck.jobs.artifacts.check_name``).
    Column("name", String(255), nullable=False),
    Column("content_type", String(255), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("job_id", "name", name="uq_job_artifacts_name"),
)


# One start of a rate-limited job: the sliding window log of ``jobdeck.jobs.flow``
# (revision 0014). The claims prune rows older than their window.
flow_starts = Table(
    "flow_starts",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    # ``type:T`` or ``queue:Q``.
    Column("limit_name", String(320), nullable=False),
    # The job's key, or "" for an unkeyed limit.
    Column("key", String(255), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    # Starts of this limit and key at this time: one claim's are one row.
    Column("count", Integer, nullable=False, default=1),
    Index("ix_flow_starts_window", "limit_name", "key", "started_at"),
)


# A rate limit a handler closed (``ctx.rate_limited``) until a time (revision 0014).
flow_closed = Table(
    "flow_closed",
    metadata,
    Column("limit_name", String(320), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("until", UTCDateTime, nullable=False),
    # The job whose handler closed it.
    Column("job_id", BigID),
)


# One line a handler logged (``ctx.log``, captured ``logging`` calls, an
# HTTP worker's heartbeat), kept per attempt. ``level`` is one of
# ``jobdeck.jobs.joblogs.LEVELS`` or ``truncated``: the one marker an attempt gets
# when its lines went past ``[logs]``'s caps. It goes with its job (the
# foreign key cascades, and retention deletes it explicitly too).
job_logs = Table(
    "job_logs",
    metadata,
    # The order lines are read in (the live poll's cursor).
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("job_id", BigID, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    # The line's number in its attempt, from 1.
    Column("seq", Integer, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("level", String(16), nullable=False),
    Column("message", Text, nullable=False),
    # The message's UTF-8 bytes: what ``max_bytes_per_job`` adds up.
    Column("size", Integer, nullable=False),
    UniqueConstraint("job_id", "attempt", "seq", name="uq_job_logs_line"),
    Index("ix_job_logs_job", "job_id", "id"),
)


# One enqueued graph of jobs (``jobdeck.jobs.workflows``, revision 0020). Its
# jobs carry ``workflow_id``; its edges are ``job_dependencies``. Its state
# is read from its jobs', and retention deletes it with them.
workflows = Table(
    "workflows",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    # Makes an enqueue happen once (a schedule's fire time): a second with
    # the same key returns the first workflow.
    Column("key", String(255)),
    # The workflow's default for its jobs' ``on_dependency_failure``.
    Column("on_dependency_failure", String(8), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("key", name="uq_workflows_key"),
    Index("ix_workflows_name", "name", "id"),
    sqlite_autoincrement=True,
)


# One edge of a workflow: ``job_id`` waits for ``depends_on`` to complete.
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("job_id", BigID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("depends_on", BigID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Index("ix_job_dependencies_on", "depends_on"),
)


# Jobs grouped for one callback (``jobdeck.jobs.workflows.Batch``, revision 0020).
# Open until closed; once closed and every job of it has ended, the
# transaction that ends the last one enqueues the callbacks and stamps
# ``fired_at``, once.
batches = Table(
    "batches",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("name", String(200)),
    # JSON: ``{"on_complete": {"type", "payload", "queue"}, ...}``.
    Column("callbacks", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("closed_at", UTCDateTime),
    Column("fired_at", UTCDateTime),
    # JSON, when fired: the counts by state and the callback jobs' ids.
    Column("outcome", Text),
    sqlite_autoincrement=True,
)
