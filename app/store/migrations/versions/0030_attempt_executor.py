"""attempts.executor: the executor that ran each attempt

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05 21:00:00

A type's jobs run on threads, on the async handlers' event loop or in child
processes, and a type can move from one to another with a change of config.
Each attempt's row now says which ran it ("thread", "async" or "process"),
so a job's history shows where each of its runs happened. NULL: an attempt
the pool did not finish itself (released at shutdown, rescued as stalled),
or one recorded before this revision.

Safe for a rolling deploy: the column is new and nullable.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | Sequence[str] | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("executor", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("executor")
