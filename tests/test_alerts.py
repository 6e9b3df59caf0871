"""Dead-letter alerts: ERROR logs, webhook delivery through the queue (retried
while unreachable) and aggregation of bursts, against a local HTTP server."""

from __future__ import annotations

import json
import logging
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.alerts import ALERT_TYPE
from jobdeck.runtime import pool_for
from jobdeck.store import Outcome


class Hook:
    """A webhook on 127.0.0.1 that records every JSON body it receives."""

    def __init__(self, port: int) -> None:
        self.received: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def alert_deck(make_config, registry, clock, port):
    config = make_config(alerts={"webhook_url": f"http://127.0.0.1:{port}/hook", "window": 300, "timeout": 2,
                                 "dashboard_url": "http://127.0.0.1:8000"})  # fmt: skip
    deck = Jobdeck(config, registry, clock=clock)
    deck.init_db()
    yield deck
    deck.store.engine.dispose()


def kill(deck, clock, n=1, job_type="demo.fail"):
    ids = [deck.enqueue(job_type, max_retries=0)[0].id for _ in range(n)]
    claimed = deck.store.claim("w", clock.now, limit=n, types=[job_type])
    deck.store.fail_many(
        [Outcome(j.id, "w", attempt=j.attempt, error="RuntimeError: broke") for j in claimed], clock.now
    )
    return ids


def run_alerts(deck, clock) -> list:
    """Run every due alert job through a worker pool's own steps."""
    pool = pool_for(deck, 1, worker_id="alerts")
    while pool.fetch_once(clock.now):
        pass
    while not pool.holdings.work.empty():
        pool.run_job(pool.holdings.work.get_nowait())
    pool.flush_acks_once(clock.now)
    return [j for j in deck.store.list_jobs(_alerts(), clock.now)]


def _alerts():
    from jobdeck.store import JobFilter

    return JobFilter(type=ALERT_TYPE, limit=50)


def test_dead_jobs_log_at_error_and_alert_once_per_window_with_the_count(alert_deck, clock, port, caplog):
    deck = alert_deck
    hook = Hook(port)
    try:
        with caplog.at_level(logging.ERROR, logger="jobdeck.alerts"):
            [first] = kill(deck, clock)
        assert f"job {first} (demo.fail) is dead after 1 attempt(s): RuntimeError: broke" in caplog.text
        run_alerts(deck, clock)
        assert [m["count"] for m in hook.received] == [1]
        msg = hook.received[0]
        assert msg["job"] == {"id": first, "type": "demo.fail", "error": "RuntimeError: broke", "attempts": 1,
                              "link": f"http://127.0.0.1:8000/jobs/{first}"}  # fmt: skip

        burst = []
        for _ in range(5):  # a burst within the window: one message at its end
            clock.advance(20)
            burst += kill(deck, clock)
        assert len(caplog.records) == 6
        run_alerts(deck, clock)
        assert len(hook.received) == 1
        clock.advance(300)
        run_alerts(deck, clock)
        assert [m["count"] for m in hook.received] == [1, 5]
        assert sorted(hook.received[1]["job_ids"]) == burst
    finally:
        hook.close()


def test_an_unreachable_webhook_is_retried_with_backoff(alert_deck, clock, port):
    deck = alert_deck
    [dead] = kill(deck, clock)
    [alert] = run_alerts(deck, clock)  # nothing listens on the port yet
    assert alert.status is State.FAILED and "webhook unreachable" in alert.error
    assert alert.available_at > clock.now
    hook = Hook(port)
    try:
        clock.now = alert.available_at
        [alert] = run_alerts(deck, clock)
        assert alert.status is State.COMPLETED
        assert [m["job"]["id"] for m in hook.received] == [dead]
    finally:
        hook.close()


def test_a_dead_alert_is_logged_not_alerted_about(alert_deck, clock):
    deck = alert_deck
    kill(deck, clock, job_type=ALERT_TYPE)
    assert run_alerts(deck, clock)[0].status is State.DEAD
    assert len(deck.store.list_jobs(_alerts(), clock.now)) == 1


@pytest.mark.backends
def test_processes_planning_at_once_share_one_window(make_config, registry, clock, port):
    """Eight decks (eight processes) each plan an alert for their own dead job
    of one type, all at once and within one window: the slot's
    compare-and-set lets one of them alert at once and at most one more
    gather the rest at the window's end, never an alert per process."""
    config = make_config(alerts={"webhook_url": f"http://127.0.0.1:{port}/hook", "window": 300})
    decks = [Jobdeck(config, registry, clock=clock) for _ in range(8)]
    decks[0].init_db()
    start = clock.now
    barrier = threading.Barrier(len(decks))
    errors: list[BaseException] = []

    def plan(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            decks[i].alerts.plan("demo.fail", start + timedelta(seconds=i))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(len(decks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    slots = sorted(j.available_at for j in decks[0].store.list_jobs(_alerts(), clock.now))
    assert 1 <= len(slots) <= 2, slots
    assert slots[0] - start <= timedelta(seconds=7)
    if len(slots) == 2:
        assert slots[1] == slots[0] + timedelta(seconds=300)
    for d in decks:
        d.store.engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_slot_another_process_took_first_is_not_taken_again(make_deck, clock, backend) -> None:
    """Two processes both read "no slot yet"; the other one inserts first.
    Ours must see its INSERT refused and move on from the other's slot, not
    take the first slot too (on PostgreSQL the INSERT ... ON CONFLICT DO
    NOTHING answers rowcount -1 either way: every racer sent an alert).
    PostgreSQL only: on SQLite the write lock is held from the read to the
    insert, so no other process can come between."""
    from jobdeck.store.alerts import claim_alert_slot

    ours, other = make_deck(clock=clock), make_deck(clock=clock)
    window = timedelta(seconds=300)
    theirs = clock.now
    mine = clock.now + timedelta(seconds=5)
    asked: list[object] = []

    def slot_for(last):
        asked.append(last)
        if last is None and len(asked) == 1:  # between our read and our insert, the other process wins
            assert claim_alert_slot(other.store, "demo.fail", lambda seen: theirs) == (None, theirs)
            return mine
        return None if last >= mine else last + window

    assert claim_alert_slot(ours.store, "demo.fail", slot_for) == (theirs, theirs + window)
    assert asked == [None, theirs]
