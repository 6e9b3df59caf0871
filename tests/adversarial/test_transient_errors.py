"""``jobdeck.store.faults.is_transient`` on errors the real drivers raise: the one
place that decides what the pool retries and what the API answers 503 for."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from jobdeck.store.faults import is_transient, storable_text
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.adversarial.outages import SqliteLock
from tests.pgtest import terminate_backends


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an error")


def test_sqlite_locked_is_transient_and_a_missing_table_is_not(tmp_path) -> None:
    path = tmp_path / "x.db"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05}, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        conn.exec_driver_sql("CREATE TABLE t (x TEXT)")
    lock = SqliteLock(str(path))
    lock.down()
    try:

        def write() -> None:
            with engine.begin() as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES ('a')")

        assert is_transient(_raised(write))
    finally:
        lock.close()

    def missing() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT * FROM nowhere")

    assert not is_transient(_raised(missing))
    engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_postgres_connection_loss_is_transient_and_refused_values_are_not(db_url: str, request) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    try:

        def run(sql: str, **params: object) -> Callable[[], object]:
            def go() -> object:
                with engine.begin() as conn:
                    return conn.execute(text(sql), params).all()

            return go

        assert not is_transient(_raised(run("SELECT CAST(:v AS text)", v="a\x00b")))  # NUL: never storable
        assert not is_transient(_raised(run("SELECT CAST(:v AS text)", v="a\udcffb")))  # unencodable
        assert not is_transient(_raised(run("SELECT 1/0")))
        assert not is_transient(_raised(run("SELECT * FROM nowhere")))

        def terminated() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                terminate_backends(request.node.pg_schema)
                conn.execute(text("SELECT 1"))

        assert is_transient(_raised(terminated))

        with socket.socket() as s:  # a port nobody listens on: connection refused
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        refused = create_engine(make_url(db_url).set(port=closed), poolclass=NullPool)
        assert is_transient(_raised(refused.connect))
        refused.dispose()
    finally:
        engine.dispose()


def test_storable_text_keeps_what_is_storable_and_shows_what_is_not() -> None:
    assert storable_text(None) is None
    assert storable_text("plain café") == "plain café"
    assert storable_text("a\x00b") == "a\\x00b"
    assert storable_text("name \udcff") == "name \\udcff"
    assert storable_text("name \udcff").encode("utf-8")
