"""workflows and batches: jobs may wait for other jobs (``blocked``)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01 23:00:00

A workflow job with unfinished dependencies is ``blocked``: never claimed,
promoted to ``pending`` by the completion that frees it (``jobdeck.store.graph``).

- ``workflows``: one enqueued graph (name, failure policy, an optional key
  that makes a scheduled enqueue happen once per fire time).
- ``job_dependencies``: one row per edge, job -> the job it waits for.
- ``batches``: jobs grouped for one callback (``on_complete``, ``on_success``,
  ``on_dead``), fired once when the batch is closed and every job has ended.
- ``jobs`` gains ``workflow_id``, ``batch_id``, ``step`` (the job's name in its
  workflow), ``deps_left`` (dependencies not yet completed) and
  ``on_dependency_failure`` (``cancel`` or ``hold``), after the columns before
  them, so rows decoded by position keep their order. The CHECK on
  ``jobs.status`` admits ``blocked``.

SQLite changes a CHECK by rebuilding the table (batch mode). Its partial and
expression indexes are not carried over by the rebuild's reflection: they are
dropped first and created again after. PostgreSQL swaps the constraint in place.

Rolling deploy: the previous release cannot read a ``blocked`` job: enqueue no
workflow until every process runs this release. Downgrading cancels blocked jobs.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "'pending', 'running', 'failed', 'dead', 'completed', 'discarded', 'cancelled'"
OLD_STATES = f"status IN ({_OLD})"
NEW_STATES = f"status IN ({_OLD}, 'blocked')"
_CLAIMABLE = "status IN ('pending', 'failed')"
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True)


def _partial_indexes() -> list[tuple[str, list[str | sa.TextClause], str]]:
    """Every partial or expression index on jobs: (name, columns, where)."""
    indexes: list[tuple[str, list[str | sa.TextClause], str]] = [
        ("ix_jobs_claim", [sa.text("priority DESC"), "available_at", "id"], _CLAIMABLE),
        ("ix_jobs_claim_queue", ["queue", sa.text("priority DESC"), "available_at", "id"], _CLAIMABLE),
        (
            "ix_jobs_error_groups",
            ["status", "type", "error_fingerprint", "updated_at"],
            "status IN ('failed', 'dead')",
        ),
        ("ix_jobs_dead_finished", ["finished_at", "id"], "status = 'dead'"),
    ]
    for name in ("rate_key", "concurrency_key"):
        columns: list[str | sa.TextClause] = [name, sa.text("priority DESC"), "available_at", "id"]
        indexes.append((f"ix_jobs_{name}", columns, f"{_CLAIMABLE} AND {name} IS NOT NULL"))
    return indexes


def _swap_check(check: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("ck_jobs_status", "jobs", type_="check")
        op.create_check_constraint("ck_jobs_status", "jobs", check)
        return
    indexes = _partial_indexes()
    for name, _, _ in indexes:
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table("jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint("ck_jobs_status", type_="check")
        batch.create_check_constraint("ck_jobs_status", check)
    for name, columns, where in indexes:
        op.create_index(name, "jobs", columns, sqlite_where=sa.text(where))


def upgrade() -> None:
    op.create_table(
        "workflows",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=True),
        sa.Column("on_dependency_failure", sa.String(length=8), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.UniqueConstraint("key", name="uq_workflows_key"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_workflows_name", "workflows", ["name", "id"])
    op.create_table(
        "batches",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("callbacks", sa.Text(), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("closed_at", _TIME, nullable=True),
        sa.Column("fired_at", _TIME, nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sqlite_autoincrement=True,
    )
    for name, type_ in (
        ("workflow_id", _ID),
        ("batch_id", _ID),
        ("step", sa.String(length=200)),
        ("deps_left", sa.Integer()),
        ("on_dependency_failure", sa.String(length=8)),
    ):
        op.add_column("jobs", sa.Column(name, type_, nullable=True))
    _swap_check(NEW_STATES)
    op.create_index(
        "ix_jobs_workflow",
        "jobs",
        ["workflow_id", "id"],
        sqlite_where=sa.text("workflow_id IS NOT NULL"),
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_batch",
        "jobs",
        ["batch_id", "status"],
        sqlite_where=sa.text("batch_id IS NOT NULL"),
        postgresql_where=sa.text("batch_id IS NOT NULL"),
    )
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", _ID, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("depends_on", _ID, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_job_dependencies_on", "job_dependencies", ["depends_on"])


def downgrade() -> None:
    op.execute(sa.text("UPDATE jobs SET status = 'cancelled' WHERE status = 'blocked'"))
    op.drop_index("ix_job_dependencies_on", table_name="job_dependencies")
    op.drop_table("job_dependencies")
    op.drop_index("ix_jobs_batch", table_name="jobs")
    op.drop_index("ix_jobs_workflow", table_name="jobs")
    _swap_check(OLD_STATES)
    with op.batch_alter_table("jobs") as batch:
        for name in ("on_dependency_failure", "deps_left", "step", "batch_id", "workflow_id"):
            batch.drop_column(name)
    op.drop_table("batches")
    op.drop_index("ix_workflows_name", table_name="workflows")
    op.drop_table("workflows")
