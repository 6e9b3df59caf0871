"""unique jobs: jobs.unique_key (UNIQUE), unique_until, unique_states

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 19:00:00

A unique job (``jobdeck.jobs.unique``) stores its key, the end of its period and
the states it holds the key in. ``ux_jobs_unique_key`` makes the database
decide between enqueues racing in any number of processes. NULL keys are
distinct on both databases, so the jobs without a key never collide.

Rolling deploy: the previous release neither reads nor writes the columns
(its enqueues leave them NULL). Downgrading drops them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("unique_key", sa.String(length=255), nullable=True))
    op.add_column("jobs", sa.Column("unique_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("unique_states", sa.Integer(), nullable=True))
    op.create_index("ux_jobs_unique_key", "jobs", ["unique_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_jobs_unique_key", table_name="jobs")
    # SQLite (3.35+) drops an unindexed column in place (the index went first).
    op.drop_column("jobs", "unique_states")
    op.drop_column("jobs", "unique_until")
    op.drop_column("jobs", "unique_key")
