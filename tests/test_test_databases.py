"""The suite's own databases: a test's ``db_url`` is a copy (SQLite) or a
reset schema (PostgreSQL, ``tests/pgtest.py``), not a new migration, so
these tests hold the copies to what a fresh migration gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from jobdeck.store import NewJob, Store, migrate, schema
from jobdeck.store.engine import make_engine
from sqlalchemy import text

from tests.pgtest import Schemas, _catalog, _versions, schema_url

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def schemas():
    made = Schemas()
    yield made
    made.close()


def _fill(url: str) -> list[int]:
    engine = make_engine(url, pool_size=2)
    try:
        store = Store(engine)
        jobs, _ = zip(*(store.enqueue(NewJob("demo.noop", {"i": i}), NOW) for i in range(30)))
        store.claim("w1", NOW, limit=5)
        return [j.id for j in jobs]
    finally:
        engine.dispose()


def test_a_copied_sqlite_file_is_at_head_and_holds_no_job(db_url):
    engine = make_engine(db_url, pool_size=1)
    try:
        assert schema.at_head(engine) and migrate.current(engine) == migrate.heads()
        assert migrate.differences(engine) == []
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 0
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_schema_given_back_is_reset_to_what_a_fresh_migration_gives(schemas):
    first = schemas.take()
    assert _fill(schema_url(first))[0] == 1
    schemas.give_back(first)
    again = schemas.take()
    assert again == first, "the reset schema is handed out again"
    engine = make_engine(schema_url(again), pool_size=1)
    try:
        assert schema.at_head(engine) and migrate.differences(engine) == []
        with engine.connect() as conn:
            tables = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": again})
            rows = {t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one() for (t,) in tables}
        assert rows.pop("alembic_version") == 1 and set(rows.values()) == {0}, rows
    finally:
        engine.dispose()
    assert _fill(schema_url(again))[0] == 1, "the sequences restart"
    schemas.give_back(again)
    assert schemas.replaced == 0


CHANGES = [
    "DROP INDEX ix_jobs_type_id",
    "CREATE INDEX ix_extra ON jobs (queue)",
    "ALTER TABLE jobs ALTER COLUMN queue SET DEFAULT 'other'",
    "ALTER TABLE jobs ALTER COLUMN queue DROP NOT NULL",
    "ALTER TABLE jobs ADD COLUMN extra integer",
    "ALTER TABLE jobs DROP COLUMN payload",
    "ALTER TABLE jobs RENAME COLUMN queue TO line",
    "ALTER TABLE jobs RENAME TO work",
    "ALTER TABLE jobs ADD CONSTRAINT ck_extra CHECK (priority < 1000)",
    "ALTER TABLE jobs DROP CONSTRAINT ck_jobs_retries",
    "ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey",
    "ALTER INDEX ix_jobs_claim RENAME TO ix_other",
    "ALTER SEQUENCE jobs_id_seq INCREMENT BY 2",
    "CREATE TABLE extra (id integer)",
    "CREATE SEQUENCE extra_seq",
    "CREATE TYPE extra_kind AS ENUM ('a')",
    "CREATE FUNCTION extra_fn() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'",
]
"""Catalog changes a test could make: each one changes the catalog digest."""


@pytest.mark.postgres
def test_a_catalog_change_changes_the_row_versions_read_before_the_catalog(schemas):
    """The reset reads the whole catalog only when the row versions changed:
    every change that changes the catalog's digest changes them too, and
    the writes a test makes to its rows (and the reset's own) do not."""
    schema = schemas.take()
    engine = make_engine(schema_url(schema), pool_size=1)
    try:
        with engine.connect() as conn:
            digest, (versions, _) = _catalog(conn, schema), _versions(conn, schema)
            conn.rollback()
            for change in CHANGES:
                with conn.begin() as tx:
                    conn.execute(text(change))
                    assert _catalog(conn, schema) != digest, change
                    assert _versions(conn, schema)[0] != versions, change
                    tx.rollback()
            _fill(schema_url(schema))
            with conn.begin():
                conn.execute(text("DELETE FROM attempts"))
                conn.execute(text("DELETE FROM jobs WHERE id % 2 = 0"))
                conn.execute(text("SELECT setval('jobs_id_seq', 1, false)"))
            assert (_catalog(conn, schema), _versions(conn, schema)) == (digest, (versions, False))
    finally:
        engine.dispose()
    schemas.give_back(schema)
    assert schemas.replaced == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_a_schema_whose_catalog_changed_is_dropped_not_handed_out(schemas):
    schemas.give_back(schemas.take())  # the reset knows the schema's row versions: a change is found through them
    first = schemas.take()
    engine = make_engine(schema_url(first), pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_jobs_type_id"))
    finally:
        engine.dispose()
    schemas.give_back(first)
    assert schemas.replaced == 1
    assert schemas.take() != first


@pytest.mark.postgres
def test_a_schema_that_was_analyzed_is_dropped_not_handed_out(schemas):
    first = schemas.take()
    _fill(schema_url(first))
    engine = make_engine(schema_url(first), pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE jobs"))
    finally:
        engine.dispose()
    schemas.give_back(first)
    assert schemas.replaced == 1
