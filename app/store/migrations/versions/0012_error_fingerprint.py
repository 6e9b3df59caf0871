"""jobs.error_fingerprint: failed and dead jobs grouped by error

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 16:00:00

The fail statement stores each failure's fingerprint (``jobdeck.core.fingerprint``)
on the job, and ``ix_jobs_error_groups`` (status, type, fingerprint,
updated_at), partial on failed and dead, serves the errors view's GROUP BY
from the index alone. Failed and dead jobs from before this revision get
their fingerprint here, computed in Python from ``jobs.error`` (the same
function the fail statement's caller uses), ``BATCH`` rows per statement
batch, walking the ids upwards so no batch reads a row twice.

Rolling deploy: the previous release neither reads nor writes the column;
the jobs it fails meanwhile have no fingerprint and are grouped as one
"no fingerprint" group until they fail again. Downgrading drops both.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from jobdeck.core.fingerprint import fingerprint

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000
_ERROR_STATES = sa.text("status IN ('failed', 'dead')")
_jobs = sa.table(
    "jobs",
    sa.column("id", sa.BigInteger()),
    sa.column("status", sa.String()),
    sa.column("error", sa.Text()),
    sa.column("error_fingerprint", sa.String()),
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("error_fingerprint", sa.String(length=255), nullable=True))
    _backfill(op.get_bind())
    op.create_index(
        "ix_jobs_error_groups",
        "jobs",
        ["status", "type", "error_fingerprint", "updated_at"],
        sqlite_where=_ERROR_STATES,
        postgresql_where=_ERROR_STATES,
    )


def _backfill(conn: sa.Connection) -> None:
    after = 0
    while True:
        rows = conn.execute(
            sa.select(_jobs.c.id, _jobs.c.error)
            .where(_jobs.c.status.in_(["failed", "dead"]), _jobs.c.id > after)
            .order_by(_jobs.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        conn.execute(
            sa.update(_jobs).where(_jobs.c.id == sa.bindparam("job")).values(error_fingerprint=sa.bindparam("fp")),
            [{"job": r.id, "fp": fingerprint(r.error)} for r in rows],
        )
        after = rows[-1].id


def downgrade() -> None:
    op.drop_index("ix_jobs_error_groups", table_name="jobs")
    # Not a batch copy of jobs: SQLite (3.35+) drops an unindexed column in place.
    op.drop_column("jobs", "error_fingerprint")
