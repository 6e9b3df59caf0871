"""Storage outages on a real SQLite file, without mounting anything: a
database that cannot grow (``PRAGMA max_page_count``, SQLite's own
``SQLITE_FULL``) and one that refuses every write (``PRAGMA query_only``,
SQLite's own ``SQLITE_READONLY``), switched on and off per connection.

The API and the dashboard answer them 507 / 503 with ``Retry-After`` and
the cause, ``/api/health`` follows them both ways with few writes of its
own, and the pool keeps a finished job's outcome until it lands: it stops
claiming meanwhile, and a stop during the outage keeps the outcome for the
next pool (tests/adversarial/test_disk_full.py does it on a full tmpfs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dashboard_support import HTMX, csrf_token, make_dash_app
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.store import storage
from jobdeck.store.faults import DISK_FULL, READ_ONLY, outage_of

from tests.conftest import wait_for
from tests.outage_support import Limits


@pytest.fixture
def limits(deck: Jobdeck) -> Limits:
    return Limits(deck)


def test_a_full_database_is_507_with_retry_after_and_the_cause(deck: Jobdeck, limits: Limits) -> None:
    client = create_app(deck=deck).test_client()
    assert client.post("/api/jobs", json={"type": "demo.noop", "payload": {}}).status_code == 201
    limits.fill(deck)
    r = client.post("/api/jobs", json={"type": "demo.noop", "payload": {"pad": "x" * 60_000}})
    assert r.status_code == 507, r.get_json()
    assert r.get_json() == {"error": DISK_FULL.message, "cause": "disk_full"}
    assert r.headers["Retry-After"] == str(DISK_FULL.retry_after)
    health = client.get("/api/health")
    assert health.status_code == 503 and "disk is full" in health.get_json()["error"]


def test_a_read_only_database_is_503_in_the_api_and_a_visible_message_in_the_dashboard(
    deck: Jobdeck, limits: Limits
) -> None:
    job, _ = deck.enqueue("demo.noop", {})
    deck.store.claim("w", deck.clock())
    dash = make_dash_app(deck).test_client()
    token = csrf_token(dash)
    limits.read_only = True
    api = dash.post("/api/jobs", json={"type": "demo.noop", "payload": {}})
    assert api.status_code == 503 and api.get_json()["cause"] == "read_only", api.get_json()
    assert api.headers["Retry-After"] == str(READ_ONLY.retry_after)
    action = f"/actions/jobs/{job.id}/cancel"
    fragment = dash.post(action, data={"from": "detail"}, headers={**HTMX, "X-CSRFToken": token})
    assert fragment.status_code == 503 and fragment.headers["Retry-After"] == str(READ_ONLY.retry_after)
    assert "read-only" in fragment.get_data(as_text=True) and 'class="flash flash-error"' in fragment.get_data(
        as_text=True
    )
    page = dash.post(action, data={"from": "detail"}, headers={"X-CSRFToken": token})
    assert page.status_code == 503 and "read-only" in page.get_data(as_text=True)
    limits.read_only = False
    assert dash.post("/api/jobs", json={"type": "demo.noop", "payload": {}}).status_code == 201


def test_sqlite_errors_are_named_by_their_cause(deck: Jobdeck, limits: Limits) -> None:
    limits.read_only = True
    raw = deck.store.engine.raw_connection()
    try:
        with pytest.raises(Exception) as refused:
            raw.driver_connection.execute("BEGIN IMMEDIATE")
    finally:
        raw.close()
    assert outage_of(refused.value) is READ_ONLY
    limits.read_only = False
    with pytest.raises(Exception) as missing, deck.store.write() as conn:
        conn.exec_driver_sql("INSERT INTO nowhere VALUES (1)")
    assert outage_of(missing.value) is None  # a bug stays a bug (500), never retried
    assert deck.store.storage.outage is None


def test_health_turns_503_while_writes_fail_and_back_without_traffic(
    deck: Jobdeck, limits: Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polled often, it writes a probe at most once every IDLE_PROBE seconds
    while writes land, and once OUTAGE_HOLD seconds after the last failure
    while they do not; it sees both edges with no other traffic."""
    monkeypatch.setattr(storage, "IDLE_PROBE", 1.0)
    monkeypatch.setattr(storage, "OUTAGE_HOLD", 1.0)
    client = create_app(deck=deck).test_client()
    polls = 0

    def health() -> int:
        nonlocal polls
        polls += 1
        return int(client.get("/api/health").status_code)

    assert health() == 200 and limits.probes == 1
    limits.read_only = True
    assert [health() for _ in range(20)] == [200] * 20, "no probe before IDLE_PROBE has passed"
    assert limits.probes == 1
    wait_for(lambda: health() == 503, 5, interval=0.01, message="health to see the outage by its own probe")
    said = client.get("/api/health").get_json()
    assert said["ok"] is False and "read_only" in said["error"], said
    limits.read_only = False
    wait_for(lambda: health() == 200, 5, interval=0.01, message="health back at 200")
    assert limits.probes == 3, f"{limits.probes} probes in {polls} polls"


@pytest.fixture
def gate_registry(registry: Registry) -> Iterator[tuple[Registry, threading.Event, list[int]]]:
    gate = threading.Event()
    ran: list[int] = []

    @registry.handler("test.gated")
    def gated(payload: dict[str, Any], ctx: JobContext) -> str:
        assert gate.wait(30)
        ran.append(ctx.job_id)
        return "done"

    yield registry, gate, ran
    gate.set()


def test_an_outcome_that_cannot_be_written_is_retried_until_it_lands_and_claims_wait(
    make_deck: Any, gate_registry: tuple[Registry, threading.Event, list[int]]
) -> None:
    _, gate, ran = gate_registry
    deck = make_deck(stall_timeout=2.0)
    limits = Limits(deck)
    job, _ = deck.enqueue("test.gated", {})
    pool = pool_for(deck, 2, poll_interval=0.05)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.RUNNING, message="the job to run")
        limits.read_only = True
        deck.store.engine.dispose()  # pooled connections are checked out again under the limit
        gate.set()
        wait_for(lambda: pool.write_outage is not None, message="the acknowledgement to meet the outage")
        assert ran == [job.id]
        assert pool.fetch_once() == 0  # no claim while outcomes wait
        assert deck.maintenance.sweep_once(deck.clock()) == []  # no rescue right after an outage
        limits.read_only = False
        wait_for(lambda: deck.store.get(job.id).status is State.COMPLETED, message="the outcome to land")
        # The write commits, then its thread clears the outage: a reader can
        # come between the two (seen on a starved machine).
        wait_for(lambda: pool.write_outage is None and deck.store.storage.outage is None,
                 message="the outage to clear once the outcome landed")  # fmt: skip
        later, _ = deck.enqueue("test.gated", {})
        wait_for(lambda: deck.store.get(later.id).status is State.COMPLETED, message="claims to resume")
        assert ran == [job.id, later.id]
    finally:
        pool.stop(grace=2)


def test_a_stop_during_the_outage_keeps_the_outcome_for_the_next_pool(
    make_deck: Any, gate_registry: tuple[Registry, threading.Event, list[int]]
) -> None:
    _, gate, ran = gate_registry
    deck = make_deck()
    limits = Limits(deck)
    job, _ = deck.enqueue("test.gated", {})
    first = pool_for(deck, 1, poll_interval=0.05)
    first.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.RUNNING, message="the job to run")
        limits.read_only = True
        deck.store.engine.dispose()
        gate.set()
        wait_for(lambda: first.write_outage is not None, message="the acknowledgement to meet the outage")
    finally:
        stopping = threading.Thread(target=first.stop, kwargs={"grace": 60})
        stopping.start()
        wait_for(first._stopping.is_set, message="the stop to begin")
        first.hurry()  # a second signal: no 60 s of retries
        stopping.join(timeout=5)
        assert not stopping.is_alive(), "the stop ended promptly after hurry"
    kept = list(first.settings.spool_folder.glob("*.acks"))
    assert len(kept) == 1 and kept[0].read_bytes().strip(b"\0"), "the outcome is kept on disk"
    assert deck.store.get(job.id).status is State.RUNNING
    limits.read_only = False
    second = pool_for(make_deck(), 1, poll_interval=0.05)
    second.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.COMPLETED, message="the kept outcome to land")
        assert not kept[0].exists()
        assert ran == [job.id], "the handler ran once"
        assert deck.store.get(job.id).worker_id == first.worker_id  # the first pool's attempt, fenced as its own
    finally:
        second.stop(grace=1)
