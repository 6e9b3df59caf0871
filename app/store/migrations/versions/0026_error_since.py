"""jobs.error_since: when a job first failed with the error it holds

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05 15:00:00

The Errors page's "First seen" of a group was the earliest *last* failure
of its jobs, so a retry of the group (which fails again with the same
error) reset it to the moment of the retry. The fail statement now keeps
``error_since`` while a job's failures keep the same fingerprint, and sets
it to the failure's time when the fingerprint changes;
``ix_jobs_error_groups`` takes the column, so the GROUP BY still reads the
index alone. Failed and dead jobs from before this revision start at their
last failure (``updated_at``), what "First seen" showed before.

Rolling deploy: the previous release neither reads nor writes the column;
a job it fails meanwhile keeps the time it held (or none: then its last
failure stands in, as before). Downgrading drops the column and restores
the index as it was.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | Sequence[str] | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ERROR_STATES = sa.text("status IN ('failed', 'dead')")
_jobs = sa.table(
    "jobs",
    sa.column("status", sa.String()),
    sa.column("updated_at", sa.DateTime(timezone=True)),
    sa.column("error_since", sa.DateTime(timezone=True)),
)


def _index(columns: list[str]) -> None:
    op.create_index("ix_jobs_error_groups", "jobs", columns, sqlite_where=_ERROR_STATES, postgresql_where=_ERROR_STATES)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("error_since", sa.DateTime(timezone=True), nullable=True))
    op.execute(sa.update(_jobs).where(_jobs.c.status.in_(["failed", "dead"])).values(error_since=_jobs.c.updated_at))
    op.drop_index("ix_jobs_error_groups", table_name="jobs")
    _index(["status", "type", "error_fingerprint", "updated_at", "error_since"])


def downgrade() -> None:
    op.drop_index("ix_jobs_error_groups", table_name="jobs")
    _index(["status", "type", "error_fingerprint", "updated_at"])
    # Not a batch copy of jobs: SQLite (3.35+) drops an unindexed column in place.
    op.drop_column("jobs", "error_since")
