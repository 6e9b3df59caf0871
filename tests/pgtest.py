"""PostgreSQL for tests: each test gets a schema of its own in the database
named by ``JOBDECK_TEST_POSTGRES_URL``, either empty (``fresh_schema``) or
already at the code's revision (``Schemas``).

Migrating a schema costs about half a second, and creating one (or a
database from a template) costs a few tenths of a second of file work on a
busy machine. So each test process migrates a *pristine* schema once and
keeps working schemas that tests take in turn. When a test ends, its
connections are cut and its schema is checked against the pristine one
and reset to it: the catalog must match exactly (tables, columns,
defaults, constraints, indexes, sequences, functions, triggers, types);
every table the test touched is truncated, which gives it new, empty files
and the planner figures of a table never vacuumed, as a new one has; every
sequence restarts; the rows the migrations write (``alembic_version``) are
copied back. A schema whose catalog changed, or that was analyzed (column
statistics outlive TRUNCATE), is dropped and a newly migrated one takes its
place. A test therefore starts from what a fresh migration gives, in
milliseconds.

Unset: the postgres variants skip, unless ``JOBDECK_REQUIRE_POSTGRES=1`` or
``CI`` is set, where a missing or unreachable PostgreSQL fails the test (CI
must never pass by skipping). Every connection of a test carries the schema
name as its ``application_name``, so a test can cut exactly its own
connections (``terminate_backends``) without disturbing anyone else using
the same server. Schema names carry a random part: several test runs (and
xdist workers) share one server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool


def base_url() -> str | None:
    return os.environ.get("JOBDECK_TEST_POSTGRES_URL") or None


def required() -> bool:
    return os.environ.get("JOBDECK_REQUIRE_POSTGRES") == "1" or bool(os.environ.get("CI"))


def admin_engine() -> Engine:
    url = base_url()
    if url is None:
        message = (
            "PostgreSQL tests need JOBDECK_TEST_POSTGRES_URL (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)"
        )
        if required():
            pytest.fail(message)
        pytest.skip(message)
    return create_engine(url, poolclass=NullPool)


def schema_url(schema: str) -> str:
    """The test URL with ``search_path`` and ``application_name`` set to ``schema``."""
    url = make_url(base_url() or "")
    query = dict(url.query)
    query["options"] = f"-csearch_path={schema}"
    query["application_name"] = schema
    return url.set(query=query).render_as_string(hide_password=False)


def terminate_backends(schema: str) -> int:
    """Kill every server connection of this test, as a database restart
    would, and wait (up to 5 s each) until they are gone. Without the wait,
    a backend starved of CPU had not yet taken its signal when this
    returned: the test's next statement went out on it and was the one
    refused (seen in ``test_backends``, on a busy machine), where after a
    restart the pool finds the connection dead before it is used."""
    engine = admin_engine()
    try:
        with engine.begin() as conn:
            return _terminate(conn, schema, wait_ms=5000)
    finally:
        engine.dispose()


def _terminate(conn: Connection, schema: str, wait_ms: int = 0) -> int:
    """Terminate the schema's connections; with ``wait_ms``, wait (up to
    that long each) until they are gone, so their locks are released."""
    return len(
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid, :wait) FROM pg_stat_activity "
                "WHERE application_name = :name AND pid <> pg_backend_pid()"
            ),
            {"name": schema, "wait": wait_ms},
        ).all()
    )


def _create_schema(engine: Engine) -> str:
    schema = f"jd_{uuid.uuid4().hex[:12]}"
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # unreachable server: fail, never skip
        pytest.fail(f"PostgreSQL at {make_url(base_url() or '').render_as_string()} is unreachable: {exc}")
    return schema


def _drop_schema(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        _terminate(conn, schema, wait_ms=5000)  # leftovers (a killed subprocess's, a leaked pool's)
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def fresh_schema(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty schema of the test's own, dropped when it ends."""
    engine = admin_engine()
    schema = _create_schema(engine)
    request.node.pg_schema = schema  # type: ignore[attr-defined]
    try:
        yield schema_url(schema)
    finally:
        _drop_schema(engine, schema)
        engine.dispose()


CATALOG = """
WITH ns AS MATERIALIZED (SELECT to_regnamespace(:schema)::oid AS oid),
owned AS MATERIALIZED (
  SELECT d.classid, d.objid FROM pg_depend d
  WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = (SELECT oid FROM ns)
),
tables AS MATERIALIZED (SELECT objid AS oid FROM owned WHERE classid = 'pg_class'::regclass),
rels AS MATERIALIZED (
  SELECT c.* FROM pg_class c WHERE c.oid IN (SELECT oid FROM tables)
  UNION ALL SELECT c.* FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid IN (SELECT oid FROM tables)
)
SELECT md5(replace(string_agg(x, E'\\n' ORDER BY x), :schema || '.', '')) FROM (
  SELECT concat_ws(' ', 'owns', classid::regclass::text, count(*)) FROM owned GROUP BY classid
  UNION ALL
  SELECT concat_ws(' ', 'rel', c.relname, c.relkind, c.relpersistence, array_to_string(c.reloptions, ','))
  FROM rels c
  UNION ALL
  SELECT concat_ws(' ', 'col', c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                   a.attnotnull, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid))
  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT concat_ws(' ', 'con', n.conname, pg_get_constraintdef(n.oid))
  FROM pg_constraint n WHERE n.conrelid IN (SELECT oid FROM tables)
  UNION ALL
  SELECT concat_ws(' ', 'idx', pg_get_indexdef(c.oid)) FROM rels c WHERE c.relkind = 'i'
  UNION ALL
  SELECT concat_ws(' ', 'seq', c.relname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement, s.seqmax,
                   s.seqmin, s.seqcache, s.seqcycle)
  FROM rels c JOIN pg_sequence s ON s.seqrelid = c.oid
  UNION ALL
  SELECT concat_ws(' ', 'fn', p.oid::regprocedure::text)
  FROM owned o JOIN pg_proc p ON p.oid = o.objid WHERE o.classid = 'pg_proc'::regclass
  UNION ALL
  SELECT concat_ws(' ', 'trg', pg_get_triggerdef(t.oid))
  FROM pg_trigger t WHERE t.tgrelid IN (SELECT oid FROM tables) AND NOT t.tgisinternal
  UNION ALL
  SELECT concat_ws(' ', 'type', t.typname)
  FROM owned o JOIN pg_type t ON t.oid = o.objid WHERE o.classid = 'pg_type'::regclass
) AS objects(x)
"""
"""One digest of everything a schema holds but its rows; the schema's own
name is taken out, so two schemas made by the same migrations agree."""

VERSIONS = """
WITH ns AS MATERIALIZED (SELECT to_regnamespace(:schema)::oid AS oid),
owned AS MATERIALIZED (
  SELECT d.ctid, d.xmin, d.classid, d.objid FROM pg_depend d
  WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = (SELECT oid FROM ns)
),
tables AS MATERIALIZED (SELECT objid AS oid FROM owned WHERE classid = 'pg_class'::regclass),
indexes AS MATERIALIZED (SELECT i.ctid, i.xmin, i.indexrelid FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM tables)),
rels AS MATERIALIZED (SELECT oid FROM tables UNION ALL SELECT indexrelid FROM indexes)
SELECT md5(string_agg(v, ' ')),
       EXISTS (SELECT 1 FROM pg_statistic WHERE starelid IN (SELECT oid FROM rels))
FROM (
  SELECT concat('dep', ctid, xmin) FROM owned
  UNION ALL SELECT concat('index', ctid, xmin) FROM indexes
  UNION ALL SELECT concat('class', ctid, xmin) FROM pg_class WHERE oid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat('att', ctid, xmin) FROM pg_attribute WHERE attrelid IN (SELECT oid FROM rels) AND attnum > 0
  UNION ALL SELECT concat('def', ctid, xmin) FROM pg_attrdef WHERE adrelid IN (SELECT oid FROM tables)
  UNION ALL SELECT concat('con', ctid, xmin) FROM pg_constraint WHERE conrelid IN (SELECT oid FROM tables)
  UNION ALL SELECT concat('seq', ctid, xmin) FROM pg_sequence WHERE seqrelid IN (SELECT oid FROM tables)
  UNION ALL SELECT concat('trg', ctid, xmin) FROM pg_trigger WHERE tgrelid IN (SELECT oid FROM tables)
  UNION ALL SELECT concat('fn', ctid, xmin) FROM pg_proc WHERE oid IN (SELECT objid FROM owned)
  UNION ALL SELECT concat('type', ctid, xmin) FROM pg_type WHERE oid IN (SELECT objid FROM owned)
) AS versions(v)
"""
"""Which versions of the catalog rows ``CATALOG`` reads the schema holds
(each row's place and the transaction that wrote it), and whether any of
its relations was analyzed (``pg_statistic``: column statistics outlive
TRUNCATE, and they steer the planner). A statement that changes the
catalog writes new versions of its rows (PostgreSQL never changes a
definition in place) or removes some, so while this digest stays the same
the catalog does, and ``CATALOG`` (a few milliseconds of the server's CPU:
each column's type and default, each index's and constraint's definition
printed) need not be read again. The rows are found through indexes only;
in a catalog grown large by many schemas made and dropped, a scan by
namespace is slower than the reading it saves. The rows are taken in the
order the plan reads them, not sorted (a tenth of the cost): rows read in
another order only make ``CATALOG`` read again."""

TABLES = """
SELECT c.relname, pg_relation_size(c.oid) / 8192,
       coalesce((SELECT max(pg_relation_size(i.indexrelid)) FROM pg_index i WHERE i.indrelid = c.oid) / 8192, 0),
       c.relpages, c.reltuples, c.relallvisible
FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = to_regnamespace(:schema)::oid
  AND d.classid = 'pg_class'::regclass AND c.relkind = 'r'
"""
"""Each table's pages (its own, and its largest index's) and what VACUUM
and ANALYZE last recorded of it for the planner."""


class Schemas:
    """Migrated schemas for one test process: a pristine one, and working
    ones handed to tests and reset when they come back. Made on first use,
    so a run with no PostgreSQL test never needs a server."""

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self.pristine: str | None = None
        self._digest = ""
        self._tables: dict[str, list[Any]] = {}
        self._children_first: list[str] = []
        self._seeded: set[str] = set()
        self._sequences: list[tuple[str, int]] = []
        self._free: list[str] = []
        self._versions: dict[str, str] = {}
        """Each schema's ``VERSIONS`` digest when it was last found at the pristine catalog."""
        self.replaced = 0
        """Schemas dropped and migrated anew (their catalog or statistics changed)."""

    def _migrated(self) -> str:
        from jobdeck.store.engine import make_engine
        from jobdeck.store.schema import ensure_current

        assert self._engine is not None
        schema = _create_schema(self._engine)
        engine = make_engine(schema_url(schema), pool_size=1)
        try:
            ensure_current(engine, auto_migrate=True)
        finally:
            engine.dispose()
        return schema

    def _start(self) -> Engine:
        if self._engine is None:
            admin_engine().dispose()  # fails (or skips) the test without a server
            self._engine = create_engine(base_url() or "", pool_size=1)
            self.pristine = self._migrated()
            with self._engine.begin() as conn:
                self._digest = _catalog(conn, self.pristine)
                self._tables = _tables(conn, self.pristine)
                self._children_first = _children_first(conn, self.pristine)
                self._seeded = {
                    t
                    for t in self._tables
                    if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{self.pristine}"."{t}")')).scalar_one()
                }
                self._sequences = [
                    (name, start)
                    for name, start in conn.execute(
                        text(
                            "SELECT c.relname, s.seqstart FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid "
                            "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = :schema)"
                        ),
                        {"schema": self.pristine},
                    )
                ]
        return self._engine

    def take(self) -> str:
        """A schema at the code's revision, with no rows but the migrations' own."""
        self._start()
        return self._free.pop() if self._free else self._migrated()

    def give_back(self, schema: str) -> None:
        """Cut the test's connections and reset the schema to the pristine
        one. A table the test wrote to is emptied; it keeps what the planner
        sees of a new table: never vacuumed nor analyzed, under ten pages
        (the planner takes ten for any smaller table never vacuumed), each
        index at most a root page; one that went past this is truncated
        instead (new, empty files; a few tenths of a second on a busy
        machine, where a DELETE of a few rows takes milliseconds). Every
        sequence restarts, and the migrations' own rows are copied back. A
        schema whose catalog changed, or that was analyzed (column
        statistics outlive TRUNCATE), is dropped and replaced."""
        engine = self._start()
        with engine.begin() as conn:
            _terminate(conn, schema, wait_ms=5000)
            versions, analyzed = _versions(conn, schema)
            same = versions == self._versions.get(schema) or _catalog(conn, schema) == self._digest
            if not same or analyzed:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                self._versions.pop(schema, None)
                self.replaced += 1
                return
            truncate, delete = [], []
            for table, (pages, index_pages, *planner) in _tables(conn, schema).items():
                if planner != self._tables[table][2:] or pages >= 10 or index_pages > 2:
                    truncate.append(table)
                elif pages > 0 or table in self._seeded:
                    delete.append(table)
            statements = []
            if truncate:
                statements.append("TRUNCATE " + ", ".join(f'"{schema}"."{t}"' for t in truncate) + " CASCADE")
            statements += [f'DELETE FROM "{schema}"."{t}"' for t in self._children_first if t in delete]
            statements += [f'SELECT setval(\'"{schema}"."{s}"\', {start}, false)' for s, start in self._sequences]
            statements += [f'INSERT INTO "{schema}"."{t}" SELECT * FROM "{self.pristine}"."{t}"' for t in self._seeded]
            conn.exec_driver_sql(";\n".join(statements))
            # TRUNCATE gives tables and indexes new files, so new catalog rows.
            self._versions[schema] = _versions(conn, schema)[0] if truncate else versions
        self._free.append(schema)

    def close(self) -> None:
        if self._engine is None:
            return
        for schema in [*self._free, self.pristine]:
            if schema is not None:
                _drop_schema(self._engine, schema)
        self._free.clear()
        self._engine.dispose()
        self._engine = None


def _catalog(conn: Connection, schema: str) -> str:
    return str(conn.execute(text(CATALOG), {"schema": schema}).scalar_one())


def _versions(conn: Connection, schema: str) -> tuple[str, bool]:
    """The schema's ``VERSIONS`` digest, and whether it was analyzed."""
    digest, analyzed = conn.execute(text(VERSIONS), {"schema": schema}).one()
    return str(digest), bool(analyzed)


def _tables(conn: Connection, schema: str) -> dict[str, list[Any]]:
    return {name: state for name, *state in conn.execute(text(TABLES), {"schema": schema})}


def _children_first(conn: Connection, schema: str) -> list[str]:
    """The schema's tables, each before every table its foreign keys point
    at, so that deleting in this order never trips a foreign key."""
    parents: dict[str, set[str]] = {name: set() for name in _tables(conn, schema)}
    for child, parent in conn.execute(
        text(
            "SELECT c.relname, p.relname FROM pg_constraint k "
            "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class p ON p.oid = k.confrelid "
            "WHERE k.contype = 'f' AND k.connamespace = to_regnamespace(:schema)::oid AND c.oid <> p.oid"
        ),
        {"schema": schema},
    ):
        parents[child].add(parent)
    ordered: list[str] = []
    while parents:
        # Next: the tables no remaining table points at (all of them, should a cycle remain).
        ready = sorted(t for t in parents if not any(t in ps for ps in parents.values())) or sorted(parents)
        ordered += ready
        for t in ready:
            del parents[t]
    return ordered


def migrated_schema(request: pytest.FixtureRequest, schemas: Schemas) -> Iterator[str]:
    """A test's own schema at the code's revision (see ``Schemas``)."""
    schema = schemas.take()
    request.node.pg_schema = schema  # type: ignore[attr-defined]
    try:
        yield schema_url(schema)
    finally:
        schemas.give_back(schema)


__all__ = ["Schemas", "admin_engine", "base_url", "fresh_schema", "migrated_schema", "schema_url", "terminate_backends"]
