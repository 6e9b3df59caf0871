"""The tables of what a job may do (artifacts, flow limits, logs, workflows
and batches) and the demo's two tables."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from jobdeck.store.models.columns import (
    Base,
    BigID,
    UTCDateTime,
)
from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column


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
