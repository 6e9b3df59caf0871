"""the overview's "died last": dead jobs indexed by when they died

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 16:45:00

The overview lists the job of each type that died last, from the dead jobs
ordered by ``finished_at``. Without an index that order is a sort of every
dead job on each poll; this partial index holds only dead jobs, so only a
transition into or out of ``dead`` touches it.

Rolling deploy: an index only; the previous release runs on this schema.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEAD = sa.text("status = 'dead'")


def upgrade() -> None:
    op.create_index("ix_jobs_dead_finished", "jobs", ["finished_at", "id"], sqlite_where=_DEAD, postgresql_where=_DEAD)


def downgrade() -> None:
    op.drop_index("ix_jobs_dead_finished", table_name="jobs")
