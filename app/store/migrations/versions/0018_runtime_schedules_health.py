"""runtime schedules and schedule health

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 18:45:00

``runtime_schedules`` holds the schedules operators make from the dashboard
or the API (one JSON definition per name, parsed like a ``[[schedules]]``
entry); ``schedule_health`` holds each watched schedule's dead man's switch
(last success, unhealthy or not, and since which success).

Rolling deploy: two new tables; the previous release ignores them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runtime_schedules",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "schedule_health",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("watched_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unhealthy", sa.Boolean(), nullable=False),
        sa.Column("episode", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("schedule_health")
    op.drop_table("runtime_schedules")
