"""Whose PostgreSQL sessions a sweep ends when it marks a worker gone
(``jobdeck.store.server_sessions``), on the bad days that blur who owns a
session:

- a process that has the host name and pid of a dead one (every container
  runs its command as pid 1: a container restarted under the same host
  name, or replicas sharing the host's name with host networking) is live,
  and its sessions stay;
- a sweeper whose role may end the sessions (``pg_signal_backend``) but is
  not the workers' role, which the server shows no ``xact_start`` of theirs,
  still finds them inside their transaction;
- a sweeper whose role may not end a session (a superuser's) logs it and
  keeps sweeping.

The pid-reuse case runs real processes in pid namespaces of their own
(``unshare``, root): both are pid 1 on this host.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobdeck.core import processes
from jobdeck.core.states import State
from jobdeck.maintenance.rescue import Rescue
from jobdeck.store import Store
from jobdeck.store.engine import make_engine, session_name
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import wait_for
from tests.pgtest import admin_engine, required

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

_DEAD = "from jobdeck.worker.pool import new_worker_id; print(new_worker_id(), flush=True)"
_LIVE = """
import sys
from jobdeck.store.engine import make_engine
from jobdeck.worker.pool import new_worker_id
from sqlalchemy import text
engine = make_engine(sys.argv[1])
print(new_worker_id(), flush=True)
with engine.begin() as conn:
    conn.execute(text("SELECT 1"))
    print("in a transaction", flush=True)
    sys.stdin.readline()
    conn.execute(text("SELECT 1"))
print("kept", flush=True)
"""


def _own_url(db_url: str) -> str:
    """The test's URL without its ``application_name``: the processes' sessions carry Jobdeck's own."""
    url = make_url(db_url)
    query = {k: v for k, v in url.query.items() if k != "application_name"}
    return url.set(query=query).render_as_string(hide_password=False)


def _as_pid_1(code: str, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["unshare", "--pid", "--fork", sys.executable, "-c", code, *args]
    return subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, **popen)  # type: ignore[call-overload]


def _pid_namespaces() -> None:
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode:
        if required():
            pytest.fail(f"the pid-reuse test needs pid namespaces: {probe.stderr.strip()}")
        pytest.skip(f"pid namespaces: {probe.stderr.strip()}")


def test_a_live_process_with_a_dead_ones_host_and_pid_keeps_its_sessions(deck, clock, db_url):
    """Both processes are pid 1 on this host. The dead one's worker is
    marked gone; the live one is inside a transaction at that moment (an HTTP
    request, an acknowledgement) and must not lose it: it holds no job of
    the dead worker, and a sweep that ended it would answer its request 503
    and note a storage outage that pauses its own sweeper."""
    _pid_namespaces()
    dead = _as_pid_1(_DEAD)
    dead_id = dead.communicate(timeout=60)[0].strip()
    assert dead.returncode == 0 and dead_id.startswith(f"{processes.HOST}:1")
    live = _as_pid_1(_LIVE, _own_url(db_url), stdin=subprocess.PIPE)
    try:
        assert live.stdout is not None and live.stdin is not None
        live_id = live.stdout.readline().strip()
        assert live_id.startswith(f"{processes.HOST}:1") and live_id != dead_id
        assert live.stdout.readline().strip() == "in a transaction"
        deck.store.register_worker(dead_id, processes.HOST, 1, 1, clock.now)
        sweeper = Rescue(deck.store, clock, deck.config.stall_timeout)
        sweeper.sweep_once(clock.advance(deck.config.stall_timeout + 1))
        assert [w["gone_at"] is not None for w in deck.store.list_workers()] == [True]
        out, _ = live.communicate("\n", timeout=60)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert live.returncode == 0 and out.strip() == "kept"


@pytest.fixture
def roles(db_url: str) -> Iterator[tuple[str, str]]:
    """A role for the workers and one for the sweeper, granted
    ``pg_signal_backend`` as the operations guide says; both may use the
    test's schema."""
    schema = make_url(db_url).query["options"].split("search_path=", 1)[1]
    tag = uuid.uuid4().hex[:8]
    worker, sweeper = f"jd_worker_{tag}", f"jd_sweeper_{tag}"
    admin = admin_engine()
    with admin.begin() as conn:
        for role in (worker, sweeper):
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
            conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
            conn.execute(text(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'))
            conn.execute(text(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"'))
        conn.execute(text(f'GRANT pg_signal_backend TO "{sweeper}"'))
    try:
        yield worker, sweeper
    finally:
        with admin.begin() as conn:
            for role in (worker, sweeper):
                conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role}
                )
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def _held(db_url: str, user: str, app: str, job_id: int):  # noqa: ANN202 - a psycopg connection
    import psycopg

    url = make_url(db_url)
    held = psycopg.connect(host=url.host, port=url.port, user=user, dbname=url.database,
                           options=url.query["options"], application_name=app)  # fmt: skip
    held.execute("SET idle_in_transaction_session_timeout = 0")
    held.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", [job_id])
    return held


def _sweeper(db_url: str, role: str, clock, stall: float) -> tuple[Store, Rescue]:  # noqa: ANN001
    store = Store(make_engine(make_url(db_url).set(username=role).render_as_string(hide_password=False)))
    return store, Rescue(store, clock, stall)


def test_a_sweeper_granted_pg_signal_backend_ends_another_roles_session(deck, clock, db_url, roles):
    """The guide's set-up: the sweeper's role is granted
    ``pg_signal_backend``, the workers run as another role. The server shows
    such a role no ``xact_start`` (nor ``state``) of another role's
    sessions, so a sweep that looked there ended nothing, and said nothing."""
    worker, sweeper_role = roles
    far = "farhost:4242:abcdef"
    deck.store.register_worker(far, "farhost", 4242, 1, clock.now)
    job, _ = deck.enqueue("demo.sleep", max_retries=1)
    assert [j.id for j in deck.store.claim(far, clock.now, limit=1)] == [job.id]
    held = _held(db_url, worker, session_name("farhost:4242"), job.id)
    store, sweeper = _sweeper(db_url, sweeper_role, clock, deck.config.stall_timeout)
    try:
        assert sweeper.sweep_once(clock.advance(deck.config.stall_timeout + 1)) == []  # locked; far marked gone
        assert wait_for(lambda: sweeper.sweep_once(clock.now), message="the job rescued") == [job.id]
        assert deck.store.get(job.id).status is State.FAILED
    finally:
        held.close()
        store.engine.dispose()


def test_a_sweeper_that_may_not_end_a_session_logs_it_and_sweeps_on(deck, clock, db_url, roles, caplog):
    """The gone process holds two jobs' rows in two sessions: a superuser's,
    which a role granted only ``pg_signal_backend`` may not end, and one of
    the workers' role, which it may. The sweep ends the one it may (its job
    is rescued by the next sweep), logs the one it may not, and later sweeps
    run (and rescue that job once its session is gone)."""
    worker_role, sweeper_role = roles
    far = "farhost:4242:abcdef"
    deck.store.register_worker(far, "farhost", 4242, 2, clock.now)
    job, _ = deck.enqueue("demo.sleep", max_retries=1)
    other, _ = deck.enqueue("demo.sleep", max_retries=1)
    assert sorted(j.id for j in deck.store.claim(far, clock.now, limit=2)) == sorted([job.id, other.id])
    superuser = make_url(db_url).username or "postgres"
    held = _held(db_url, superuser, session_name("farhost:4242"), job.id)
    endable = _held(db_url, worker_role, session_name("farhost:4242"), other.id)
    store, sweeper = _sweeper(db_url, sweeper_role, clock, deck.config.stall_timeout)
    try:
        with caplog.at_level(logging.WARNING, logger="jobdeck.maintenance"):
            assert sweeper.sweep_once(clock.advance(deck.config.stall_timeout + 1)) == []
        assert "could not end the database sessions of gone workers farhost:4242:abcdef" in caplog.text
        assert "ended 1 database session(s) of gone workers farhost:4242:abcdef" in caplog.text
        assert wait_for(lambda: sweeper.sweep_once(clock.now), message="the endable one's job rescued") == [other.id]
        assert sweeper.sweep_once(clock.now) == []  # the superuser's still held: skipped, no error
        held.close()  # the server ends the backend, and its lock, a moment later
        assert wait_for(lambda: sweeper.sweep_once(clock.now), message="the job rescued") == [job.id]
    finally:
        held.close()
        endable.close()
        store.engine.dispose()
