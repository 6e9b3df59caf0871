"""flow control: rate limits and concurrency per key

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 19:00:00

``jobs.rate_key`` and ``jobs.concurrency_key``: a job's key for a keyed
limit (``jobdeck.jobs.flow``), computed at enqueue. ``ix_jobs_rate_key`` and
``ix_jobs_concurrency_key`` hold only waiting jobs with a key, in claim
order per key: the claim walks them key by key, so a hot key's backlog is
one seek, not a scan. ``flow_starts`` is the rate limits' sliding window
log (one row per limit, key and claim, with its count); ``flow_closed`` holds the limits a handler closed (``ctx.rate_limited``).

Rolling deploy: the previous release neither reads nor writes the new
columns and tables; the jobs it enqueues have no key (an unkeyed job is
counted by a keyed limit under the key ``null``, once it is claimed by this
release). Downgrading drops them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = ("rate_key", "concurrency_key")


def _keyed(name: str) -> sa.TextClause:
    return sa.text(f"status IN ('pending', 'failed') AND {name} IS NOT NULL")


def upgrade() -> None:
    for name in _KEYS:
        op.add_column("jobs", sa.Column(name, sa.String(length=255), nullable=True))
        op.create_index(
            f"ix_jobs_{name}",
            "jobs",
            [name, sa.text("priority DESC"), "available_at", "id"],
            sqlite_where=_keyed(name),
            postgresql_where=_keyed(name),
        )
    op.create_table(
        "flow_starts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("limit_name", sa.String(length=320), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
    )
    op.create_index("ix_flow_starts_window", "flow_starts", ["limit_name", "key", "started_at"])
    op.create_table(
        "flow_closed",
        sa.Column("limit_name", sa.String(length=320), primary_key=True),
        sa.Column("key", sa.String(length=255), primary_key=True),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("flow_closed")
    op.drop_index("ix_flow_starts_window", table_name="flow_starts")
    op.drop_table("flow_starts")
    for name in reversed(_KEYS):
        op.drop_index(f"ix_jobs_{name}", table_name="jobs")
        op.drop_column("jobs", name)
