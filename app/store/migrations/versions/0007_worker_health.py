"""worker health: abandoned handler threads and why a pool is unhealthy

Revision ID: 0007
Revises: 0004
Create Date: 2026-12-01 10:15:00

A handler that outlives its timeout leaves its thread running (a Python
thread cannot be killed). Each pool writes how many such threads it has and,
past ``max_abandoned_threads``, why it is unhealthy, into its own workers
row, so the Workers page of any process shows the health of every process
sharing the database.

Safe for a rolling deploy: both columns are new and nullable or defaulted,
so the previous release's inserts and reads keep working.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("abandoned_threads", sa.Integer(), server_default="0", nullable=False))
    op.add_column("workers", sa.Column("unhealthy", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("unhealthy")
        batch.drop_column("abandoned_threads")
