"""attempts may end "snoozed", and keep how long

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 19:00:00

A handler that returns or raises ``Snooze(seconds)`` puts its job back to
``pending`` for ``seconds`` without counting a retry (``Store.snooze_many``);
its attempt's row has the outcome ``snoozed`` and the delay in the new
``attempts.snooze_seconds``. The CHECK on ``attempts.outcome`` admits it.
SQLite rebuilds the attempts table to change a CHECK (batch mode);
PostgreSQL swaps the constraint in place.

Rolling deploy: the previous release writes neither and reads attempts by
column name, but it cannot read a ``snoozed`` outcome: let no handler
snooze until every process runs this release. Downgrading makes snoozed
attempts ``interrupted`` (no retry counted either) and drops the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "outcome IN ('completed', 'failed', 'timed_out', 'stalled', 'interrupted', 'cancelled')"
NEW = "outcome IN ('completed', 'failed', 'timed_out', 'stalled', 'interrupted', 'cancelled', 'snoozed')"


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("snooze_seconds", sa.Float(), nullable=True))
        batch.drop_constraint("ck_attempts_outcome", type_="check")
        batch.create_check_constraint("ck_attempts_outcome", NEW)


def downgrade() -> None:
    op.execute(sa.text("UPDATE attempts SET outcome = 'interrupted' WHERE outcome = 'snoozed'"))
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("ck_attempts_outcome", type_="check")
        batch.create_check_constraint("ck_attempts_outcome", OLD)
        batch.drop_column("snooze_seconds")
