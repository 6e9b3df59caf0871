"""jobs.traceparent: the W3C trace context a job was enqueued in

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05 16:00:00

With tracing on (``[tracing] enabled``), an enqueue stores the trace
context current at the time (the request's span, or the ``traceparent``
header of ``POST /api/jobs``) on the job, and each attempt's span is a
child of it: one trace from the request to every attempt. NULL with
tracing off, and for every job from before this revision.

Rolling deploy: the previous release neither reads nor writes the column;
its jobs run in spans of their own. Downgrading drops the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | Sequence[str] | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    # Not a batch copy of jobs: SQLite (3.35+) drops an unindexed column in place.
    op.drop_column("jobs", "traceparent")
