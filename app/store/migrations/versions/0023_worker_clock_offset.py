"""workers.clock_offset: how far each process's host clock is off the database's

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 09:00:00

On PostgreSQL every process runs on the database's clock (``jobdeck.core.clock``) and
measures how far its host's clock is off it; the Workers page and ``/metrics``
show that offset per process, so an operator sees a host whose NTP is broken.
Null on SQLite (one host, one clock) and before the first measurement.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("clock_offset", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("clock_offset")
