"""dashboard sessions bound to the user's credential

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03 09:00:00

A session outlived a change of its user's password or role in the config:
whoever held the cookie kept the old access. Each session now records a
fingerprint of the password hash and role it was opened with
(``dashboard_sessions.credential``), and a request is refused when the
fingerprint no longer matches the user as configured.

Sessions opened before this revision have none and are refused: everyone
signs in again once. Rolling deploy: the previous release writes sessions
without a fingerprint, which this release refuses (a sign-in on an old
process is asked again on a new one); the previous release ignores the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dashboard_sessions") as batch:
        batch.add_column(sa.Column("credential", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dashboard_sessions") as batch:
        batch.drop_column("credential")
