"""job_artifacts: the files handlers keep for people to download

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 15:45:00

``ctx.artifact(name, data)`` keeps a report or an export in the database
(both backends), one row per job and name, so an operator downloads it from
the job page and every process serving the dashboard has it; no file on one
server's disk. The rows go with their job: ON DELETE CASCADE, and retention
deletes them explicitly too.

Safe for a rolling deploy: the previous release never reads the table.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_artifacts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "name", name="uq_job_artifacts_name"),
    )


def downgrade() -> None:
    op.drop_table("job_artifacts")
