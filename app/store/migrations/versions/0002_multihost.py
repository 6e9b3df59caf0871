"""multi-host: queue-aware claim index; autovacuum settings for jobs on PostgreSQL

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

``ix_jobs_claim_queue`` serves the claim of a pool restricted to some queues
(a host that only runs ``reports``, say): without it, that claim walks the
whole claim index past every due job of the other queues. Like
``ix_jobs_claim`` it holds only claimable rows, so it stays small.

On PostgreSQL the jobs table is a hot queue: every job is inserted, updated
two to four times and later deleted by retention, so dead row versions pile
up far faster than the default autovacuum triggers (20% of the table) notice.
Vacuuming at 1% dead rows and analyzing at 2% changed rows keeps the claim
index lean and the planner's picture of the (mostly finished) table current;
a fillfactor of 90 leaves room on each page for the next version of a row,
so an update usually writes to the page it already has. These are
per-table storage parameters: changing them takes a lock that does not block
reads or writes, so the upgrade is safe while the previous release is running.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
    "fillfactor": "90",
}


def upgrade() -> None:
    claimable = sa.text("status IN ('pending', 'failed')")
    op.create_index(
        "ix_jobs_claim_queue",
        "jobs",
        ["queue", sa.text("priority DESC"), "available_at", "id"],
        sqlite_where=claimable,
        postgresql_where=claimable,
    )
    if op.get_bind().dialect.name == "postgresql":
        settings = ", ".join(f"{k} = {v}" for k, v in JOBS_STORAGE.items())
        op.execute(f"ALTER TABLE jobs SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE jobs RESET ({', '.join(JOBS_STORAGE)})")
    op.drop_index("ix_jobs_claim_queue", table_name="jobs")
