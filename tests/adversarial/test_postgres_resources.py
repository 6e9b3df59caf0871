"""PostgreSQL out of disk, memory or connections, against the real server.

- 53100 disk_full, for real: the test's tables live in a tablespace on an
  8 MB tmpfs, filled until the server cannot extend a table file.
- 53300 too_many_connections, for real: the deck connects as a role whose
  ``CONNECTION LIMIT`` drops to 0 under it (``ALTER ROLE``).
- 53200 out_of_memory cannot be caused on a shared server without starving
  everyone on it: a trigger raises that SQLSTATE inside the server, so the
  real driver reads a real error response.

Before: 53100 and 53200 answered 500; 53300 answered 503 without saying why,
and an acknowledgement that met 53100 was stored as the job's failure and,
when that failed too, left the job running until the process stopped.
"""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.config import load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.adversarial.mounts import small_disk
from tests.conftest import wait_for
from tests.pgtest import admin_engine, schema_url, terminate_backends

pytestmark = pytest.mark.slow


@contextmanager
def schema(options: str = "", user: str | None = None) -> Iterator[tuple[str, str]]:
    """A fresh schema and the URL of a connection to it (``options`` added to
    its ``-c`` settings, as ``user`` if given); dropped after."""
    admin = admin_engine()
    name = f"jd_{uuid.uuid4().hex[:12]}"
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    url = make_url(schema_url(name))
    if options:
        url = url.set(query={**url.query, "options": f"{url.query['options']} {options}"})
    if user:
        url = url.set(username=user)
    try:
        yield name, url.render_as_string(hide_password=False)
    finally:
        terminate_backends(name)
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def deck_on(url: str, tmp_path: Path, registry: Registry, init: bool = True) -> Jobdeck:
    config = load(
        path=None, env={},
        overrides={"database_url": url, "instance_path": str(tmp_path / "instance"), "workers": 0,
                   "secret_key": "test-secret", "poll_interval": 0.05, "heartbeat_interval": 0.5, "stall_timeout": 5.0},
    )  # fmt: skip
    deck = Jobdeck(config, registry)
    if init:
        deck.init_db()
    return deck


def _incompressible(n: int) -> str:
    return base64.b64encode(os.urandom(n * 3 // 4)).decode()


def test_a_full_tablespace_is_507_and_health_503_until_space_returns(tmp_path: Path, registry: Registry) -> None:
    admin = admin_engine()
    space = f"jd_space_{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="jobdeck-pg-disk-"))  # under /tmp: the server must reach it
    folder.chmod(0o755)
    postgres = pwd.getpwnam("postgres")
    deck: Jobdeck | None = None
    try:
        with small_disk(tmp_path, 8, folder) as disk:
            (disk / "space").mkdir()
            os.chown(disk / "space", postgres.pw_uid, postgres.pw_gid)
            with admin.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                    text(f"CREATE TABLESPACE {space} LOCATION '{disk / 'space'}'")
                )
            try:
                with schema(f"-cdefault_tablespace={space}") as (_, url):
                    deck = deck_on(url, tmp_path, registry)
                    client = create_app(deck=deck).test_client()
                    ballast = disk / "ballast"
                    with ballast.open("wb") as fh:
                        fh.write(b"\0" * (shutil.disk_usage(disk).free - (1 << 20)))  # 1 MB left for the tables
                    accepted, answer = 0, None
                    for _ in range(500):
                        answer = client.post(
                            "/api/jobs", json={"type": "demo.noop", "payload": {"pad": _incompressible(40_000)}}
                        )
                        if answer.status_code != 201:
                            break
                        accepted += 1
                    assert answer is not None and answer.status_code == 507, (accepted, answer and answer.get_json())
                    assert answer.get_json()["cause"] == "disk_full" and answer.headers["Retry-After"] == "30"
                    health = client.get("/api/health")
                    assert health.status_code == 503 and "disk_full" in health.get_json()["error"]
                    ballast.unlink()
                    wait_for(lambda: client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201, 10,
                             interval=0.1, message="enqueues to land again")  # fmt: skip
                    wait_for(lambda: client.get("/api/health").status_code == 200, 15, interval=0.2,
                             message="health to say 200 again")  # fmt: skip
                    print(f"\nPostgreSQL, tables on an 8 MB tablespace: {accepted} jobs of 40 KB accepted, then 507 "
                          "(53100 disk_full, Retry-After 30), health 503; back to 201 and 200 once space was freed")  # fmt: skip
                    deck.store.engine.dispose()
            finally:
                with admin.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                        text(f"DROP TABLESPACE IF EXISTS {space}")
                    )
    finally:
        admin.dispose()
        folder.rmdir()


def test_a_role_out_of_connections_is_503_naming_it(tmp_path: Path, registry: Registry) -> None:
    admin = admin_engine()
    role = f"jd_role_{uuid.uuid4().hex[:8]}"
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
    try:
        with schema() as (name, url):
            deck_on(url, tmp_path, registry).store.engine.dispose()  # the tables, made by the owner
            with admin.begin() as conn:
                conn.execute(text(f'GRANT USAGE ON SCHEMA "{name}" TO {role}'))
                conn.execute(text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{name}" TO {role}'))
                conn.execute(text(f'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA "{name}" TO {role}'))
            deck = deck_on(make_url(url).set(username=role).render_as_string(hide_password=False), tmp_path, registry,
                           init=False)  # fmt: skip
            client = create_app(deck=deck).test_client()
            try:
                assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201
                with admin.begin() as conn:
                    conn.execute(text(f"ALTER ROLE {role} CONNECTION LIMIT 0"))
                deck.store.engine.dispose()  # the next request needs a new connection
                refused = client.post("/api/jobs", json={"type": "demo.noop"})
                assert refused.status_code == 503, refused.get_json()
                assert refused.get_json()["cause"] == "too_many_connections", refused.get_json()
                assert refused.headers["Retry-After"] == "1"
                assert client.get("/api/health").status_code == 503
                with admin.begin() as conn:
                    conn.execute(text(f"ALTER ROLE {role} CONNECTION LIMIT -1"))
                assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201
                wait_for(lambda: client.get("/api/health").status_code == 200, 15, interval=0.2,
                         message="health to say 200 again")  # fmt: skip
            finally:
                deck.store.engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def _raise_in(table: str, when: str, sqlstate: str, message: str) -> str:
    """DDL for a trigger that makes the server raise ``sqlstate``."""
    return (
        f"CREATE FUNCTION jd_fault() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = '{sqlstate}'; END $$; "
        f"CREATE TRIGGER jd_fault {when} ON {table} FOR EACH ROW EXECUTE FUNCTION jd_fault()"
    )


def test_out_of_memory_is_503(tmp_path: Path, registry: Registry) -> None:
    with schema() as (_, url):
        deck = deck_on(url, tmp_path, registry)
        client = create_app(deck=deck).test_client()
        try:
            with deck.store.engine.begin() as conn:
                conn.exec_driver_sql(_raise_in("jobs", "BEFORE INSERT", "53200", "out of memory"))
            refused = client.post("/api/jobs", json={"type": "demo.noop"})
            assert refused.status_code == 503 and refused.get_json()["cause"] == "out_of_memory", refused.get_json()
            assert refused.headers["Retry-After"] == "5"
            assert client.get("/api/health").status_code == 503
            with deck.store.engine.begin() as conn:
                conn.exec_driver_sql("DROP TRIGGER jd_fault ON jobs")
            assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201
        finally:
            deck.store.engine.dispose()


def test_an_acknowledgement_that_meets_a_full_disk_lands_after_it(tmp_path: Path, registry: Registry) -> None:
    gate, ran = threading.Event(), []

    @registry.handler("test.gated")
    def gated(payload: dict[str, Any], ctx: JobContext) -> None:
        assert gate.wait(30)
        ran.append(ctx.job_id)

    with schema() as (_, url):
        deck = deck_on(url, tmp_path, registry)
        job, _ = deck.enqueue("test.gated", {})
        pool = pool_for(deck, 1)
        pool.start()
        try:
            wait_for(lambda: deck.store.get(job.id).status is State.RUNNING, message="the job to run")
            with deck.store.engine.begin() as conn:
                conn.exec_driver_sql(_raise_in("attempts", "BEFORE INSERT", "53100", "could not extend file"))
            gate.set()
            wait_for(lambda: pool.write_outage is not None, message="the acknowledgement to meet the full disk")
            assert pool.write_outage.cause == "disk_full"
            assert deck.store.get(job.id).status is State.RUNNING
            with deck.store.engine.begin() as conn:
                conn.exec_driver_sql("DROP TRIGGER jd_fault ON attempts")
            wait_for(lambda: deck.store.get(job.id).status is State.COMPLETED, message="the acknowledgement to land")
            assert ran == [job.id]
        finally:
            gate.set()
            pool.stop(grace=2)
            deck.store.engine.dispose()
