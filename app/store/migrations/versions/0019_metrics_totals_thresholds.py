"""metrics and threshold alerts: stats_totals, threshold_alerts, workers.queues

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 19:00:00

- ``stats_totals``: one row per job type holding the all-time sums of the
  per-minute counters (outcomes and run-time buckets). The roll-up adds to it
  in the same transaction as to ``stats_minutely``, and retention never
  deletes from it, so the Prometheus counters read from it never go down
  when old minutes are pruned. Filled here from the minutes still kept.
- ``threshold_alerts``: whether each threshold alert (queue latency, failure
  rate, no live workers) is firing; moved by compare-and-set, so of several
  processes exactly one sends each "firing" and each "recovered".
- ``workers.queues``: the queues a worker pool claims from (JSON list; NULL
  for every queue), so "no live worker for a queue" can be told.

Rolling deploy: the previous release neither reads nor writes these; while
it rolls up minutes, those minutes reach ``stats_totals`` only through this
release's roll-ups (the counters then lag, never go back).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = ["completed", "failed", "dead", *[f"dur_{i:02d}" for i in range(48)]]


def upgrade() -> None:
    op.create_table(
        "stats_totals",
        sa.Column("type", sa.String(200), primary_key=True),
        *[sa.Column(name, sa.BigInteger(), nullable=False, server_default="0") for name in COUNTERS],
    )
    sums = ", ".join(f"COALESCE(SUM({name}), 0)" for name in COUNTERS)
    op.execute(
        f"INSERT INTO stats_totals (type, {', '.join(COUNTERS)}) SELECT type, {sums} FROM stats_minutely GROUP BY type"
    )
    op.create_table(
        "threshold_alerts",
        sa.Column("key", sa.String(400), primary_key=True),
        sa.Column("firing", sa.Boolean(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
    )
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("queues", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("queues")
    op.drop_table("threshold_alerts")
    op.drop_table("stats_totals")
