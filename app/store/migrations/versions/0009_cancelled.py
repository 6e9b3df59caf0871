"""jobs may be cancelled; a running job may carry a cancel request

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 15:45:00

``jobs.cancel_requested_at`` records when a person or the API cancelled a
job. A pending or failed job is ``cancelled`` at once; a running one keeps
running with the column set until its attempt ends, and the fenced
complete, fail, rescue and release statements then end it ``cancelled``.
The CHECKs on ``jobs.status`` and ``attempts.outcome`` admit ``cancelled``.

SQLite changes a CHECK by rebuilding the table (batch mode). The claim
indexes are partial expression indexes, which the rebuild's reflection does
not carry over: they are dropped first and created again after, as the
models define them. PostgreSQL swaps the constraints in place.

Rolling deploy: the previous release never writes the column nor the state,
but it cannot read a ``cancelled`` job: cancel nothing until every process
runs this release. Downgrading makes cancelled jobs ``discarded`` and
cancelled attempts ``failed`` (the nearest states it knows).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATES = "status IN ('pending', 'running', 'failed', 'dead', 'completed', 'discarded')"
NEW_STATES = "status IN ('pending', 'running', 'failed', 'dead', 'completed', 'discarded', 'cancelled')"
OLD_OUTCOMES = "outcome IN ('completed', 'failed', 'timed_out', 'stalled', 'interrupted')"
NEW_OUTCOMES = "outcome IN ('completed', 'failed', 'timed_out', 'stalled', 'interrupted', 'cancelled')"
CLAIM_INDEXES: dict[str, list[str | sa.TextClause]] = {
    "ix_jobs_claim": [sa.text("priority DESC"), "available_at", "id"],
    "ix_jobs_claim_queue": ["queue", sa.text("priority DESC"), "available_at", "id"],
}


def _rebuild_jobs(check: str, drop_request: bool = False) -> None:
    """The jobs CHECK swapped (and, going down, the column dropped)."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("ck_jobs_status", "jobs", type_="check")
        op.create_check_constraint("ck_jobs_status", "jobs", check)
        if drop_request:
            op.drop_column("jobs", "cancel_requested_at")
        return
    for name in CLAIM_INDEXES:
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table("jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint("ck_jobs_status", type_="check")
        batch.create_check_constraint("ck_jobs_status", check)
        if drop_request:
            batch.drop_column("cancel_requested_at")
    claimable = sa.text("status IN ('pending', 'failed')")
    for name, columns in CLAIM_INDEXES.items():
        op.create_index(name, "jobs", columns, sqlite_where=claimable)


def _swap_attempts_check(check: str) -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("ck_attempts_outcome", type_="check")
        batch.create_check_constraint("ck_attempts_outcome", check)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
    _rebuild_jobs(NEW_STATES)
    _swap_attempts_check(NEW_OUTCOMES)


def downgrade() -> None:
    op.execute(sa.text("UPDATE jobs SET status = 'discarded' WHERE status = 'cancelled'"))
    op.execute(sa.text("UPDATE attempts SET outcome = 'failed' WHERE outcome = 'cancelled'"))
    _swap_attempts_check(OLD_OUTCOMES)
    _rebuild_jobs(OLD_STATES, drop_request=True)
