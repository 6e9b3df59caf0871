"""server-side dashboard sessions

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 10:05:00

A dashboard session was only a signed cookie: logging out cleared the
browser's copy, and a copied cookie kept working forever. Each login now
records a row (the SHA-256 of the cookie's token); logout deletes it, in
every process that shares the database.

Safe for a rolling deploy: the previous release never reads the table, and
its sessions (cookies without a token) are simply asked to log in again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_dashboard_sessions_created", "dashboard_sessions", ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_created", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
