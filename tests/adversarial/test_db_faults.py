"""Database faults: bursts of ``pg_terminate_backend`` against this test's
own connections (``tests.pgtest.terminate_backends``, never anyone else's)
while a live server accepts jobs over HTTP and its pool drains them; an
unreachable or locked database answers 503 with ``Retry-After``, never 500;
the LISTEN connection comes back by itself."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.worker.listener import Listener, conninfo
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.adversarial.outages import Outage
from tests.conftest import wait_for
from tests.pgtest import terminate_backends

ROOT = Path(__file__).resolve().parents[2]
postgres_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

BURSTS = 5
BURST_SECONDS = 1.0
KILL_EVERY = 0.05
RECOVERY_BOUND = 2.0


class Client:
    """One keep-alive HTTP connection to the live server (a fresh one after any error)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], Any]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        data = None if body is None else json.dumps(body).encode()
        try:
            self.conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise
        payload = (
            json.loads(raw) if raw and response.getheader("Content-Type", "").startswith("application/json") else raw
        )
        return response.status, {k.lower(): v for k, v in response.getheaders()}, payload

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[int]:
    """``jobdeck serve --demo`` on this test's schema: 4 worker threads, a
    fast stall sweep (acknowledgements cut mid-flight are rescued), and a
    retry budget no termination burst exhausts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(
        PYTHONPATH=str(ROOT),
        JOBDECK_DATABASE_URL=db_url,
        JOBDECK_INSTANCE_PATH=str(tmp_path / "instance"),
        JOBDECK_WORKERS="4",
        JOBDECK_POLL_INTERVAL="0.2",
        JOBDECK_HEARTBEAT_INTERVAL="0.5",
        JOBDECK_STALL_TIMEOUT="3",
        JOBDECK_SWEEP_INTERVAL="0.5",
        JOBDECK_DEFAULT_MAX_RETRIES="25",
        JOBDECK_BACKOFF_BASE="0.05",
        JOBDECK_BACKOFF_CAP="0.5",
        JOBDECK_SHUTDOWN_GRACE="1",
    )
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobdeck.cli", "serve", "--demo", "--bind", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = Client(port)

    def up() -> bool:
        try:
            return client.request("GET", "/api/health")[0] == 200
        except OSError:
            return proc.poll() is not None

    try:
        wait_for(up, timeout=30, interval=0.05, message="server up")
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        yield port
    finally:
        client.close()
        # waitress can swallow the Shutdown that SIGTERM raises (issue 9,
        # "Signals", fixed apart from this test): a second one, then a kill.
        for _ in range(2):
            proc.terminate()
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.alone  # recovery times are bounded
@postgres_only
def test_backend_termination_bursts_lose_nothing_and_recover_fast(
    server: int, request: pytest.FixtureRequest, db_url: str
) -> None:
    schema: str = request.node.pg_schema
    stop = threading.Event()
    accepted: list[int] = []
    statuses: Counter[int] = Counter()
    unavailable_without_retry_after: list[Any] = []
    server_errors: list[Any] = []
    lock = threading.Lock()
    clients: list[Client] = []

    def enqueue_forever(worker: int) -> None:
        client = Client(server)
        clients.append(client)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                status, headers, body = client.request(
                    "POST", "/api/jobs", {"type": "demo.noop", "payload": {"w": worker, "n": n}}
                )
            except (OSError, http.client.HTTPException):
                continue  # the answer was lost: not accepted, so nothing to check
            with lock:
                statuses[status] += 1
                if status == 201:
                    accepted.append(body["id"])
                elif status == 503:
                    if "retry-after" not in headers:
                        unavailable_without_retry_after.append(body)
                elif status >= 500:
                    server_errors.append((status, body))

    enqueuers = [threading.Thread(target=enqueue_forever, args=(i,), daemon=True) for i in range(3)]
    for t in enqueuers:
        t.start()
    probe = Client(server)
    clients.append(probe)
    recoveries: list[float] = []
    killed = 0
    try:
        wait_for(lambda: len(accepted) >= 20, timeout=20, message="traffic flowing")
        for _ in range(BURSTS):
            burst_end = time.monotonic() + BURST_SECONDS
            while time.monotonic() < burst_end:
                killed += terminate_backends(schema)
                stop.wait(KILL_EVERY)  # the burst's own rhythm, not a wait for a result
            recoveries.append(_recovery(probe, time.monotonic()))
            before = len(accepted)
            wait_for(lambda n=before: len(accepted) > n + 10, timeout=10, message="traffic flowing between bursts")
        stop.set()
        for t in enqueuers:
            t.join(timeout=15)
        ids = list(accepted)
        left = _wait_completed(db_url, ids)
    finally:
        stop.set()
        for t in enqueuers:
            t.join(timeout=15)
        for client in clients:
            client.close()
    figures = (
        f"db faults: {BURSTS} bursts of {BURST_SECONDS:g}s, {killed} backends terminated, "
        f"{len(ids)} jobs accepted (201), {len(left)} lost, answers {dict(sorted(statuses.items()))}, "
        f"recovery max {max(recoveries):.2f}s (each: {', '.join(f'{r:.2f}' for r in recoveries)})"
    )
    print(figures)
    assert killed > BURSTS, f"the bursts terminated almost nothing: {figures}"
    assert not left, f"accepted jobs not completed: {left[:20]}; {figures}"
    assert not server_errors, f"5xx other than 503: {server_errors[:5]}; {figures}"
    assert not unavailable_without_retry_after, f"503 without Retry-After: {unavailable_without_retry_after[:3]}"
    assert max(recoveries) < RECOVERY_BOUND, figures


def _recovery(probe: Client, burst_ended: float) -> float:
    """Seconds from the end of a burst until a job enqueued over HTTP has
    been claimed: the first successful enqueue, then its claim."""
    job_id = None
    deadline = burst_ended + 30
    while time.monotonic() < deadline:
        try:
            if job_id is None:
                status, _, body = probe.request("POST", "/api/jobs", {"type": "demo.noop", "payload": {"probe": True}})
                if status == 201:
                    job_id = body["id"]
                continue
            status, _, body = probe.request("GET", f"/api/jobs/{job_id}")
            if status == 200 and body["status"] != "pending":
                return time.monotonic() - burst_ended
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.01)  # polling interval with a deadline, not a fixed wait
    raise AssertionError("no recovery within 30 s of a burst")


def _wait_completed(db_url: str, ids: list[int], timeout: float = 60) -> list[tuple[int, str]]:
    """Wait until every id is completed; returns the ones that are not."""
    engine = create_engine(db_url, poolclass=NullPool)
    try:

        def not_done() -> list[tuple[int, str]]:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT id, status FROM jobs WHERE id = ANY(:ids)"), {"ids": ids}).all()
            found = {r.id: r.status for r in rows}
            return [(i, found.get(i, "missing")) for i in ids if found.get(i) != "completed"]

        deadline = time.monotonic() + timeout
        while (left := not_done()) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling interval with a deadline, not a fixed wait
        return left
    finally:
        engine.dispose()


@pytest.mark.backends
def test_an_unreachable_or_locked_database_answers_503_with_retry_after(
    backend: str, db_url: str, make_deck: Callable[..., Jobdeck]
) -> None:
    """PostgreSQL: every connection cut and new ones refused (a TCP relay
    switched off). SQLite: another process holds the write lock for longer
    than busy_timeout. Either way an outage, so 503 and Retry-After."""
    from dashboard_support import make_dash_app

    outage = Outage(backend, db_url)
    try:
        deck = make_deck(database_url=outage.url, sqlite_busy_timeout=0.2)
        api = create_app(deck=deck).test_client()
        dash = make_dash_app(deck).test_client()
        job = {"type": "demo.noop"}
        assert api.post("/api/jobs", json=job).status_code == 201
        with outage:
            answers = [api.post("/api/jobs", json=job)]
            if backend == "postgres":  # SQLite still reads under another's write lock
                answers += [api.get("/api/jobs"), dash.get("/jobs/pending")]
            for response in answers:
                assert response.status_code == 503, (response.status_code, response.get_data(as_text=True)[:300])
                assert response.headers["Retry-After"] == "1"
            assert answers[0].get_json() == {
                "error": "the database is unavailable right now; retry shortly",
                "cause": "unavailable",
            }
        wait_for(
            lambda: api.post("/api/jobs", json=job).status_code == 201, timeout=10, message="back after the outage"
        )
    finally:
        outage.close()


def test_a_database_error_that_is_no_outage_stays_a_500(deck: Jobdeck) -> None:
    """Only outages become 503: a bug (here a missing table) must not be
    disguised as something to retry."""
    app = create_app(deck=deck)
    with deck.store.write() as conn:
        conn.exec_driver_sql("ALTER TABLE jobs RENAME TO jobs_elsewhere")
    app.config["PROPAGATE_EXCEPTIONS"] = False
    response = app.test_client().post("/api/jobs", json={"type": "demo.noop"})
    assert response.status_code == 500


@postgres_only
def test_listen_reconnects_after_its_backend_is_terminated(
    db_url: str, request: pytest.FixtureRequest, make_deck
) -> None:
    deck = make_deck()
    wakes = threading.Event()
    listener = Listener(conninfo(db_url), wakes.set, max_backoff=0.5, tick=0.05)
    listener.start()
    try:
        wait_for(listener.connected.is_set, timeout=10, message="listening")
        for _ in range(3):
            before = listener.listens
            assert terminate_backends(request.node.pg_schema) >= 1
            wait_for(
                lambda n=before: listener.listens > n,
                timeout=10,
                message="listening again after its backend was terminated",
            )
        assert listener.reconnects >= 3
        heard = listener.received
        wakes.clear()
        deck.enqueue("demo.noop")
        wait_for(lambda: listener.received > heard, timeout=10, message="a NOTIFY after the reconnects")
        assert wakes.is_set()
    finally:
        listener.stop()


@postgres_only
def test_listen_survives_a_failing_wake_up(db_url: str, make_deck: Callable[..., Jobdeck]) -> None:
    """Any error in the listening thread (here its wake-up callback) ends in
    a reconnect, never in a dead thread and a pool that only polls."""
    deck = make_deck()
    calls: list[int] = []

    def flaky_wake() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("wake-up failed")

    listener = Listener(conninfo(db_url), flaky_wake, max_backoff=0.5, tick=0.05)
    listener.start()
    try:
        wait_for(lambda: listener.listens >= 2, timeout=10, message="listening again after the failed wake-up")
        heard = listener.received
        deck.enqueue("demo.noop")
        wait_for(lambda: listener.received > heard, timeout=10, message="a NOTIFY heard")
    finally:
        listener.stop()


def _pooled_sockets_readable(deck: Jobdeck) -> bool:
    """Every connection resting in the deck's pool has heard from the server
    (its terminated backend's FATAL, or the close)."""
    import select

    pool: Any = deck.store.engine.pool
    resting = [rec.dbapi_connection for rec in list(pool._pool.queue)]
    assert resting, "the pool holds no connection to test"
    poller = select.poll()
    for conn in resting:
        poller.register(conn.fileno(), select.POLLIN)
    return len(poller.poll(0)) == len(resting)


@postgres_only
def test_a_pooled_connection_whose_backend_was_terminated_is_replaced_at_checkout(
    request: pytest.FixtureRequest, make_deck: Callable[..., Jobdeck], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No round trip is spent pinging a connection at checkout: a resting
    connection whose socket is quiet is handed out as it is, and one whose
    server spoke (a terminated backend's FATAL and close, as at a restart)
    is pinged and replaced (``jobdeck.store.engine.quiet``). Every path: the
    driver-level single enqueue, Core's keyed enqueue, a read, the
    driver-level "why is it waiting?" read, a bulk."""
    from jobdeck.store import engine
    from jobdeck.store.engine import quiet
    from jobdeck.store.waiting import read_waiting

    monkeypatch.setattr(engine, "PING_AFTER_REST", 3600.0)  # the socket alone decides here
    deck = make_deck()
    for round_ in range(3):
        first = deck.enqueue("demo.noop", {"round": round_}).job
        with deck.store.engine.connect() as conn:
            assert quiet(conn.connection.driver_connection), "a connection just used is quiet"
        assert terminate_backends(request.node.pg_schema) >= 1
        wait_for(lambda: _pooled_sockets_readable(deck), timeout=10, message="the terminated backends' sockets")
        job = deck.enqueue("demo.noop", {"round": round_, "after": "kill"}).job
        assert job.id > first.id
        assert terminate_backends(request.node.pg_schema) >= 1
        wait_for(lambda: _pooled_sockets_readable(deck), timeout=10, message="the terminated backends' sockets")
        keyed = deck.enqueue("demo.noop", idempotency_key=f"k{round_}")
        assert keyed.created
        assert deck.store.get(job.id) is not None
        assert terminate_backends(request.node.pg_schema) >= 1
        wait_for(lambda: _pooled_sockets_readable(deck), timeout=10, message="the terminated backends' sockets")
        assert read_waiting(deck.store, deck.clock()).pools == []  # the driver-level read (``glance``)
        assert len(deck.enqueue_many([{"type": "demo.noop"}] * 3)) == 3
    assert deck.store.counts(deck.clock())["pending"] == 3 * 6


@postgres_only
def test_a_pooled_connection_a_middlebox_forgot_is_pinged_after_its_rest(
    db_url: str, make_deck: Callable[..., Jobdeck], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that forgot the connection (a NAT or firewall that dropped its
    state, a rebooted host) says nothing until the client writes: the
    socket stays quiet. A connection that rested past ``PING_AFTER_REST``
    is pinged anyway, so the forgotten one is replaced before the enqueue
    uses it, on the driver-level path and on Core's. Within its rest, a
    forgotten connection fails that one call as an outage (503), and takes
    the rest of the pool with it: the next call succeeds."""
    from jobdeck.store import engine
    from jobdeck.store.faults import is_unavailable
    from sqlalchemy.exc import DBAPIError

    outage = Outage("postgres", db_url)
    try:
        deck = make_deck(database_url=outage.url)
        with deck.store.engine.connect() as a, deck.store.engine.connect() as b:  # two connections resting
            assert a is not b
        monkeypatch.setattr(engine, "PING_AFTER_REST", 3600.0)
        outage._switch.forget_flows()
        with pytest.raises(DBAPIError) as caught:
            deck.enqueue("demo.noop")
        assert is_unavailable(caught.value), caught.value
        assert deck.enqueue("demo.noop").created  # the other forgotten one was replaced with the pool

        monkeypatch.setattr(engine, "PING_AFTER_REST", 0.0)
        for path in ("plain", "keyed", "plain"):
            outage._switch.forget_flows()
            enqueued = deck.enqueue("demo.noop", idempotency_key="k" if path == "keyed" else None)
            assert enqueued.job.id > 0
        assert deck.store.counts(deck.clock())["pending"] == 4
    finally:
        outage.close()


@postgres_only
def test_the_driver_level_enqueue_raises_what_the_api_answers_503_for(
    request: pytest.FixtureRequest, make_deck: Callable[..., Jobdeck]
) -> None:
    """A connection cut while in use (here: checked out, then its backend
    terminated before the insert) fails the single enqueue as SQLAlchemy's
    error, an outage the API answers 503 and the pool retries, and the
    broken connection leaves the pool; the next enqueue succeeds."""
    from jobdeck.store.faults import is_unavailable
    from sqlalchemy.exc import DBAPIError

    deck = make_deck()
    deck.enqueue("demo.noop")
    store = deck.store
    with pytest.raises(DBAPIError) as caught, store.alone() as db:
        assert terminate_backends(request.node.pg_schema) >= 1
        db.execute("SELECT 1")
    assert is_unavailable(caught.value), caught.value
    assert caught.value.connection_invalidated
    assert deck.enqueue("demo.noop").created
    with pytest.raises(DBAPIError) as caught, store.alone() as db:
        db.execute("SELECT * FROM no_such_table")  # a bug, not an outage: 500, and the connection stays
    assert not is_unavailable(caught.value) and not caught.value.connection_invalidated
    assert deck.enqueue("demo.noop").created
    with pytest.raises(KeyboardInterrupt), store.alone() as db:
        db.pgconn.send_query(b"SELECT pg_sleep(0.2)")  # interrupted between the send and the answer
        raise KeyboardInterrupt
    resting = [rec.dbapi_connection for rec in list(store.engine.pool._pool.queue)]
    assert all(conn is None or not conn.info.transaction_status for conn in resting), "a busy connection was pooled"
    assert deck.enqueue("demo.noop").created
