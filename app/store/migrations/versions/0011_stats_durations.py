"""per-minute run-time histograms: stats_minutely.dur_00 ... dur_47

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:00:00

Each (minute, type) counter row gains one count per run-time bucket
(``jobdeck.store.durations``: two buckets per doubling from 1 ms, the last from
about 2.3 h on), filled by the roll-up, so the Queues page reads p50 and p95
per type from counters. The columns default to 0: rows rolled up before this
revision count no durations (their minutes show counts without percentiles).

Rolling deploy: the previous release neither reads nor writes these columns,
and its inserts get the server default, so it runs on this schema.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = [f"dur_{i:02d}" for i in range(48)]


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("stats_minutely", sa.Column(name, sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("stats_minutely") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
