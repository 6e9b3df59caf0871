"""workers.loop_held_*: the last time the pool's async handlers' loop was held

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05 18:00:00

Every ``async def`` job of a pool shares one event loop thread; a blocking
call inside one of them (``time.sleep``, a synchronous HTTP client) stops
all of them. The pool's watchdog notices a loop held past a second, logs it
and keeps the last one in the pool's row (how long, by which job and type,
when), so the Workers page of every process shows it.

Safe for a rolling deploy: every column is new and nullable.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | Sequence[str] | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("loop_held_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("loop_held_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("loop_held_job", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("loop_held_type", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("loop_held_type")
        batch.drop_column("loop_held_job")
        batch.drop_column("loop_held_at")
        batch.drop_column("loop_held_seconds")
