"""The schema revision this code needs, and the start-up check against it
that does not load Alembic (``jobdeck.store.migrate``): Alembic and its
revision scripts are 11 MB of every process's memory, and only a database
behind this code needs them."""

from __future__ import annotations

from sqlalchemy import Engine, text

HEAD = "0030"
"""The newest revision in ``app/store/migrations/versions``; a new revision
moves it (``tests/test_migrations.py`` holds it to Alembic's head)."""


_HAS_VERSION_TABLE = {
    "postgresql": "SELECT to_regclass('alembic_version') IS NOT NULL",
    "sqlite": "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version')",
}
"""Whether Alembic's table is there, found as the next statement will find it
(PostgreSQL: on the ``search_path``). One short catalog read: the dialects'
``has_table`` builds and runs a general reflection query, a few milliseconds
of every start-up (and of every test that opens a store)."""


def at_head(engine: Engine) -> bool:
    """The database is at ``HEAD``: Alembic's version table, read directly."""
    with engine.connect() as conn:
        if not conn.exec_driver_sql(_HAS_VERSION_TABLE[engine.dialect.name]).scalar():
            return False
        return {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))} == {HEAD}


def ensure_current(engine: Engine, auto_migrate: bool) -> None:
    """Start-up: nothing to do at head; otherwise upgrade, or refuse, as
    ``jobdeck.store.migrate.ensure_current`` decides."""
    if at_head(engine):
        return
    from jobdeck.store import migrate

    migrate.ensure_current(engine, auto_migrate)
