"""workers.late_beat_seconds, late_beat_at: the last heartbeat that landed late

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05 10:00:00

A process starved of CPU (or stuck behind the database) beats late; once a
beat is ``stall_timeout`` old, other processes rescue its jobs. The pool
notices a late beat when it lands, logs it and keeps it in its row, so the
Workers page of every process shows which worker came close, and when.

Safe for a rolling deploy: both columns are new and nullable.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("late_beat_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("late_beat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("late_beat_at")
        batch.drop_column("late_beat_seconds")
