"""bulk actions: their total, their progress and whether they finished

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03 10:00:00

A bulk action's batch moved its jobs in one transaction and added them to
its audit entry in another, so a process killed between the two left the
entry short of what moved (5,000 said, 5,500 moved), and nothing said the
action had been cut short. Each batch now counts into the entry in its own
transaction, and the entry says how far the action meant to go and whether
it got there:

- ``total``: the jobs it set out to move (NULL for every other action, and
  for the bulk actions recorded before this revision, which read as before);
- ``finished_at``: set by its last batch;
- ``owner`` and ``updated_at``: the process that moved its last batch, and
  when, so an unfinished action reads as interrupted once that process is
  gone or it made no progress for two minutes;
- ``ix_audit_log_bulk``: a person's latest bulk action, for the notice the
  job lists show of an interrupted one (partial: only bulk actions are in it).

Rolling deploy: the previous release writes bulk entries without ``total``
(shown as plain entries, as before) and ignores the new columns.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BULK = "total IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("total", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("owner", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_audit_log_bulk", "audit_log", ["actor", "id"],
        sqlite_where=sa.text(_BULK), postgresql_where=sa.text(_BULK),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_audit_log_bulk", table_name="audit_log")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("updated_at")
        batch.drop_column("owner")
        batch.drop_column("finished_at")
        batch.drop_column("total")
