"""attempts may end "interrupted" (cut short by shutdown)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:30:00

A job that shutdown releases while its handler runs keeps an attempt row
with the outcome ``interrupted`` (``Store.release``); the CHECK on
``attempts.outcome`` admits it. SQLite rebuilds the attempts table to
change a CHECK (batch mode); PostgreSQL swaps the constraint.

Rolling deploy: the previous release writes none of this outcome and reads
attempts without caring about the value, so it runs on this schema.
Downgrading deletes interrupted rows first (their jobs are pending again).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "outcome IN ('completed', 'failed', 'timed_out', 'stalled')"
NEW = "outcome IN ('completed', 'failed', 'timed_out', 'stalled', 'interrupted')"


def _swap(check: str) -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("ck_attempts_outcome", type_="check")
        batch.create_check_constraint("ck_attempts_outcome", check)


def upgrade() -> None:
    _swap(NEW)


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM attempts WHERE outcome = 'interrupted'"))
    _swap(OLD)
