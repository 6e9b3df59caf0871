"""partial unique indexes on jobs.idempotency_key and jobs.unique_key

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 03:30:00

Most jobs have neither key, yet each added a NULL entry to both UNIQUE
indexes: two of the six index entries a plain enqueue wrote. Both become
partial (``WHERE ... IS NOT NULL``), so a plain job is in neither; a keyed
job is checked exactly as before. The enqueue's ``ON CONFLICT`` names the
same predicate, which both databases need to match a partial index.

- ``idempotency_key``: the table's UNIQUE constraint becomes the partial
  unique index ``ux_jobs_idempotency_key``.
- ``ux_jobs_unique_key``: the same index, partial.

SQLite cannot drop a table constraint in place: the table is rebuilt (batch
mode), its partial and expression indexes dropped first and created again
after, as in 0020. Its UNIQUE constraint has no name there; the rebuild's
naming convention gives it the one the downgrade writes back. PostgreSQL
swaps the constraint for the index in place (both are built under the
migration's lock: the table takes no writes meanwhile).

Rolling deploy: the previous release's enqueue says ``ON CONFLICT
(idempotency_key) DO NOTHING`` without the predicate, which matches no index
once this runs: upgrade every process that enqueues with a key or unique
before (or with) the migration. Downgrading restores the constraint.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLAIMABLE = "status IN ('pending', 'failed')"
_UQ = "uq_jobs_idempotency_key"
"""The constraint's name on SQLite once the downgrade wrote it (unnamed before)."""
_NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
_KEYED = "idempotency_key IS NOT NULL"
_UNIQUE = "unique_key IS NOT NULL"


def _partial_indexes() -> list[tuple[str, list[str | sa.TextClause], str]]:
    """Every partial or expression index on jobs at 0020: (name, columns, where)."""
    indexes: list[tuple[str, list[str | sa.TextClause], str]] = [
        ("ix_jobs_claim", [sa.text("priority DESC"), "available_at", "id"], _CLAIMABLE),
        ("ix_jobs_claim_queue", ["queue", sa.text("priority DESC"), "available_at", "id"], _CLAIMABLE),
        (
            "ix_jobs_error_groups",
            ["status", "type", "error_fingerprint", "updated_at"],
            "status IN ('failed', 'dead')",
        ),
        ("ix_jobs_dead_finished", ["finished_at", "id"], "status = 'dead'"),
    ]
    for name in ("rate_key", "concurrency_key"):
        columns: list[str | sa.TextClause] = [name, sa.text("priority DESC"), "available_at", "id"]
        indexes.append((f"ix_jobs_{name}", columns, f"{_CLAIMABLE} AND {name} IS NOT NULL"))
    indexes.append(("ix_jobs_workflow", ["workflow_id", "id"], "workflow_id IS NOT NULL"))
    indexes.append(("ix_jobs_batch", ["batch_id", "status"], "batch_id IS NOT NULL"))
    return indexes


def _key_constraint() -> str:
    """The PostgreSQL name of the UNIQUE constraint on idempotency_key
    (``jobs_idempotency_key_key`` unless the database was made otherwise)."""
    for uc in sa.inspect(op.get_bind()).get_unique_constraints("jobs"):
        if uc["column_names"] == ["idempotency_key"] and uc["name"]:
            return str(uc["name"])
    return "jobs_idempotency_key_key"


def _rebuild_sqlite(keyed_constraint: bool) -> None:
    """Rebuild jobs with (downgrade) or without (upgrade) the UNIQUE constraint."""
    indexes = _partial_indexes()
    for name, _, _ in indexes:
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table(
        "jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}, naming_convention=_NAMING
    ) as batch:
        if keyed_constraint:
            batch.create_unique_constraint(_UQ, ["idempotency_key"])
        else:
            batch.drop_constraint(_UQ, type_="unique")
    for name, columns, where in indexes:
        op.create_index(name, "jobs", columns, sqlite_where=sa.text(where))


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.drop_index("ux_jobs_unique_key", table_name="jobs")
    if sqlite:
        _rebuild_sqlite(keyed_constraint=False)
    else:
        op.drop_constraint(_key_constraint(), "jobs", type_="unique")
    for name, column, where in (("ux_jobs_idempotency_key", "idempotency_key", _KEYED),
                                ("ux_jobs_unique_key", "unique_key", _UNIQUE)):  # fmt: skip
        op.create_index(
            name, "jobs", [column], unique=True, sqlite_where=sa.text(where), postgresql_where=sa.text(where)
        )


def downgrade() -> None:
    op.drop_index("ux_jobs_unique_key", table_name="jobs")
    op.drop_index("ux_jobs_idempotency_key", table_name="jobs")
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(keyed_constraint=True)
    else:
        op.create_unique_constraint("jobs_idempotency_key_key", "jobs", ["idempotency_key"])
    op.create_index("ux_jobs_unique_key", "jobs", ["unique_key"], unique=True)
