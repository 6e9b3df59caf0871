"""The suite's own databases: a test's ``db_url`` is a copy (SQLite) or a
reset schema (PostgreSQL, ``tests/pgtest.py``), not a new migration, so
these tests hold the copies to what a fresh migration gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from jobdeck.store import NewJob, Store, migrate, schema
from jobdeck.store.engine import make_engine
from sqlalchemy import text

from tests.pgtest import Schemas, schema_url

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


@pytest.mark.postgres
@pytest.mark.slow
def test_a_schema_whose_catalog_changed_is_dropped_not_handed_out(schemas):
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
