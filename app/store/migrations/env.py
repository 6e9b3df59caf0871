"""Alembic's entry point, run by ``jobdeck.store.migrate`` (never by an alembic.ini).

``jobdeck.store.migrate`` opens the connection, takes the migration lock and passes the
connection in ``config.attributes["connection"]``; this module only binds
Alembic to it. Offline (SQL script) mode is not supported: Jobdeck migrates
the database it runs on.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from jobdeck.store.models import UTCDateTime, metadata
from sqlalchemy import TextClause

config = context.config


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    # Revisions must not import jobdeck.store.models (it changes after they are
    # written): render our UTC type as the plain column type it stores.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    # SQLite cannot reflect a DESC index column, so an existing index such as
    # ix_jobs_claim would be "changed" on every autogenerate; compare such
    # indexes on PostgreSQL, which reflects them exactly.
    if type_ == "index" and compare_to is not None and context.get_bind().dialect.name == "sqlite":
        model_index = compare_to if reflected else obj
        return not any(isinstance(e, TextClause) for e in model_index.expressions)
    return True


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run migrations through jobdeck.store.migrate (jobdeck db upgrade), not the alembic command")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
        include_object=include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline mode is not supported; run `jobdeck db upgrade` against the database")
run()
