"""PostgreSQL for tests: one fresh schema per test in the database named by
``JOBDECK_TEST_POSTGRES_URL``.

Unset: the postgres variants skip, unless ``JOBDECK_REQUIRE_POSTGRES=1`` or
``CI`` is set, where a missing or unreachable PostgreSQL fails the test (CI
must never pass by skipping). Every connection of a test carries the schema
name as its ``application_name``, so a test can cut exactly its own
connections (``terminate_backends``) without disturbing anyone else using
the same server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
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
    """Kill every server connection of this test (as a database restart would)."""
    engine = admin_engine()
    try:
        with engine.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": schema},
                ).all()
            )
    finally:
        engine.dispose()


def fresh_schema(request: pytest.FixtureRequest) -> Iterator[str]:
    engine = admin_engine()
    schema = f"jd_{uuid.uuid4().hex[:12]}"
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # unreachable server: fail, never skip
        engine.dispose()
        pytest.fail(f"PostgreSQL at {make_url(base_url() or '').render_as_string()} is unreachable: {exc}")
    request.node.pg_schema = schema  # type: ignore[attr-defined]
    try:
        yield schema_url(schema)
    finally:
        terminate_backends(schema)  # leftovers (a killed subprocess's, a leaked pool's)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


__all__ = ["admin_engine", "base_url", "fresh_schema", "schema_url", "terminate_backends"]
