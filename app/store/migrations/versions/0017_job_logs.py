"""job_logs: what a handler logged, per attempt (``ctx.log``)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 19:00:00

One row per log line: the job, the attempt, the line's number in that
attempt (``seq``), its time, level and message, and the message's size in
UTF-8 bytes (what ``[logs] max_bytes_per_job`` adds up). Lines are read in
the order they were stored (``id``), so the job page's live poll asks for
the lines after the last one it has. The rows go with their job: ON DELETE
CASCADE, and retention deletes them explicitly too.

Rolling deploy: a new table; the previous release never reads it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "seq", name="uq_job_logs_line"),
    )
    op.create_index("ix_job_logs_job", "job_logs", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_logs_job", table_name="job_logs")
    op.drop_table("job_logs")
