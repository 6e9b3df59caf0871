"""effects ledger in two phases; the demo gateway takes an idempotency key

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00

The ledger recorded a key and then performed the effect: a crash between
the two left the key and no effect, and the retry skipped it. Each effect
now has a ``state`` (started, done, not_performed), the attempt and worker
that started it, when it finished, and the JSON result a redelivery returns.

Safe for a rolling deploy: existing rows, and rows the previous release
keeps inserting (it names only key, job_id, attempt, created_at), get the
server default ``done``, which is what they meant to it (recorded means
performed); its ``forget`` still deletes. The demo gateway's new key column
is nullable, and NULLs never collide in a UNIQUE constraint.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("effects") as batch:
        batch.add_column(sa.Column("state", sa.String(length=16), server_default="done", nullable=False))
        batch.add_column(sa.Column("worker_id", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("result", sa.Text(), nullable=True))
        batch.add_column(sa.Column("resolved_by", sa.String(length=200), nullable=True))
        batch.create_check_constraint("ck_effects_state", "state IN ('started', 'done', 'not_performed')")
        batch.create_index("ix_effects_job", ["job_id"], unique=False)
    with op.batch_alter_table("demo_charges") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch.create_unique_constraint("uq_demo_charges_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("demo_charges") as batch:
        batch.drop_constraint("uq_demo_charges_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
    # Unknown (started) effects read as performed to the previous release,
    # which is the safe side: it skips them rather than performing them twice.
    op.execute("DELETE FROM effects WHERE state = 'not_performed'")
    with op.batch_alter_table("effects") as batch:
        batch.drop_index("ix_effects_job")
        batch.drop_constraint("ck_effects_state", type_="check")
        batch.drop_column("resolved_by")
        batch.drop_column("result")
        batch.drop_column("finished_at")
        batch.drop_column("started_at")
        batch.drop_column("worker_id")
        batch.drop_column("state")
