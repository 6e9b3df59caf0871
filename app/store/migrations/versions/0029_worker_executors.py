"""workers.executors: what each of a pool's executors holds, for the Workers page

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05 21:00:00

A pool runs handlers on threads, on an event loop and in child processes.
Its monitor keeps a small JSON summary in the pool's row (per executor, its
capacity and busy slots; for the process pool, each child's pid, job,
resident memory and jobs run, and the children replaced by cause), so the
Workers page and /metrics of every process show every pool's executors.

Safe for a rolling deploy: the column is new and nullable.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | Sequence[str] | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("executors", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("executors")
