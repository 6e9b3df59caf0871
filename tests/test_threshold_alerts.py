"""Threshold alerts: each threshold (queue latency, failure rate, no live
workers) fires once and recovers once, delivered through the alert queue to
a real local webhook; several processes checking at once send each move
once; the config is checked with errors naming the key."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.thresholds import THRESHOLD_TYPE
from jobdeck.runtime import pool_for
from jobdeck.store import JobFilter, Outcome
from jobdeck.store.thresholds import threshold_states

from tests.conftest import wait_for
from tests.test_alerts import Hook, free_port

pytestmark = pytest.mark.backends


@pytest.fixture
def port() -> int:
    return free_port()


def settings(port: int, **thresholds: object) -> dict:
    return {"webhook_url": f"http://127.0.0.1:{port}/hook", "timeout": 2, "dashboard_url": "http://jobs.example",
            "thresholds": thresholds}  # fmt: skip


def sent(hook: Hook) -> list[dict]:
    """The threshold messages the hook got (dead jobs send their own alerts too)."""
    return [m for m in hook.received if str(m.get("event", "")).startswith("threshold.")]


def deliver(deck, clock) -> list:
    """Run the due alert jobs through a worker pool's own steps (the alert queue only)."""
    pool = pool_for(deck, 1, worker_id="alerter", queues=["jobdeck"])
    while pool.fetch_once(clock.now):  # one pool thread: a job per round
        while not pool.holdings.work.empty():
            pool.run_job(pool.holdings.work.get_nowait())
        pool.flush_acks_once(clock.now)
    return deck.store.list_jobs(JobFilter(type=THRESHOLD_TYPE, limit=50), clock.now)


def test_queue_latency_fires_once_and_recovers_once(make_deck, clock, port):
    deck = make_deck(clock=clock, alerts=settings(port, queue_latency=60))
    hook = Hook(port)
    try:
        deck.enqueue("demo.noop", queue="mail")
        clock.advance(30)
        assert deck.thresholds.check_once(clock.now) == []
        clock.advance(31)
        assert deck.thresholds.check_once(clock.now) == [("queue_latency:mail", True)]
        clock.advance(15)
        assert deck.thresholds.check_once(clock.now) == []  # still crossed: nothing more
        assert [j.status for j in deliver(deck, clock)] == [State.COMPLETED]
        [firing] = sent(hook)
        assert firing["event"] == "threshold.firing" and firing["alert"] == "queue_latency"
        assert firing["queue"] == "mail" and firing["threshold"] == 60 and firing["value"] == pytest.approx(61)
        assert "queue mail" in firing["text"] and firing["dashboard"] == "http://jobs.example"

        [job] = deck.store.claim("w", clock.now, queues=["mail"])
        deck.store.complete(job.id, "w", clock.now)
        assert deck.thresholds.check_once(clock.now) == [("queue_latency:mail", False)]
        assert deck.thresholds.check_once(clock.now) == []
        deliver(deck, clock)
        assert [m["event"] for m in sent(hook)] == ["threshold.firing", "threshold.recovered"]
        assert sent(hook)[1]["queue"] == "mail" and sent(hook)[1]["since"] == firing["at"]
    finally:
        hook.close()


def test_a_paused_queue_does_not_alert_on_latency(make_deck, clock, port):
    deck = make_deck(clock=clock, alerts=settings(port, queue_latency=60))
    deck.enqueue("demo.noop", queue="mail")
    deck.queues.set_paused("mail", True, clock.now, "alice")
    clock.advance(600)
    assert deck.thresholds.check_once(clock.now) == []


def _finish(deck, clock, job_type: str, n: int, *, ok: bool) -> None:
    ids = [deck.enqueue(job_type, max_retries=0)[0].id for _ in range(n)]  # a failure is final
    claimed = deck.store.claim("w", clock.now, limit=n, types=[job_type])
    assert sorted(j.id for j in claimed) == sorted(ids)
    if ok:
        for j in claimed:
            deck.store.complete(j.id, "w", clock.now)
    else:
        deck.store.fail_many([Outcome(j.id, "w", attempt=j.attempt, error="RuntimeError: broke") for j in claimed],
                             clock.now)  # fmt: skip


def test_failure_rate_fires_once_and_recovers_once(make_deck, clock, port):
    deck = make_deck(clock=clock, alerts=settings(port, failure_rate=50, failure_window=600, failure_min_runs=3))
    hook = Hook(port)
    try:
        deck.maintenance.rollup_once(clock.now)  # the roll-up's watermark starts here
        _finish(deck, clock, "demo.fail", 2, ok=False)
        clock.advance(120)
        deck.maintenance.rollup_once(clock.now)
        assert deck.thresholds.check_once(clock.now) == []  # 2 runs: under failure_min_runs
        _finish(deck, clock, "demo.fail", 2, ok=False)
        _finish(deck, clock, "demo.noop", 5, ok=True)  # another type's successes do not dilute it
        clock.advance(120)
        deck.maintenance.rollup_once(clock.now)
        assert deck.thresholds.check_once(clock.now) == [("failure_rate:demo.fail", True)]
        assert deck.thresholds.check_once(clock.now) == []
        deliver(deck, clock)
        [firing] = sent(hook)
        assert firing["type"] == "demo.fail" and firing["value"] == 100 and firing["threshold"] == 50

        _finish(deck, clock, "demo.fail", 10, ok=True)  # 4 failed of 14: 29%
        clock.advance(120)
        deck.maintenance.rollup_once(clock.now)
        assert deck.thresholds.check_once(clock.now) == [("failure_rate:demo.fail", False)]
        deliver(deck, clock)
        assert [(m["event"], m["type"]) for m in sent(hook)] == [
            ("threshold.firing", "demo.fail"), ("threshold.recovered", "demo.fail")]  # fmt: skip
    finally:
        hook.close()


def test_no_live_workers_fires_once_and_recovers_once(make_deck, clock, port):
    deck = make_deck(clock=clock, alerts=settings(port, no_live_workers=["reports"]))
    hook = Hook(port)
    try:
        deck.store.register_worker("mail-only", "h", 1, 2, clock.now, queues=["mail"])
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:reports", True)]
        deliver(deck, clock)  # a pool that is never started registers no worker
        deck.store.register_worker("reports", "h", 2, 2, clock.now, queues=["reports", "mail"])
        clock.advance(1)
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:reports", False)]
        deliver(deck, clock)
        assert [(m["event"], m["queue"]) for m in sent(hook)] == [
            ("threshold.firing", "reports"), ("threshold.recovered", "reports")]  # fmt: skip
        clock.advance(deck.config.stall_timeout + 1)  # the pool went silent
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:reports", True)]
    finally:
        hook.close()


def test_several_processes_send_each_move_once(make_deck, clock, port):
    config = settings(port, queue_latency=60)
    decks = [make_deck(clock=clock, alerts=config) for _ in range(4)]
    decks[0].enqueue("demo.noop", queue="mail")
    clock.advance(61)

    def race() -> list:
        barrier = threading.Barrier(len(decks))
        moves: list = []
        lock = threading.Lock()

        def check(deck: Jobdeck) -> None:
            barrier.wait(timeout=10)
            won = deck.thresholds.check_once(clock.now)
            with lock:
                moves.extend(won)

        threads = [threading.Thread(target=check, args=(d,)) for d in decks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return moves

    assert race() == [("queue_latency:mail", True)]
    [job] = decks[1].store.claim("w", clock.now, queues=["mail"])
    decks[1].store.complete(job.id, "w", clock.now)
    clock.advance(1)
    assert race() == [("queue_latency:mail", False)]
    alerts = decks[0].store.list_jobs(JobFilter(type=THRESHOLD_TYPE, limit=50), clock.now)
    assert len(alerts) == 2


def test_without_a_webhook_the_moves_are_logged(make_deck, clock, caplog):
    deck = make_deck(clock=clock, alerts={"thresholds": {"no_live_workers": ["default"]}})
    with caplog.at_level("INFO", logger="jobdeck.alerts"):
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:default", True)]
        deck.store.register_worker("p", "h", 1, 1, clock.now)
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:default", False)]
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert caplog.records[0].alert == "no_live_workers" and caplog.records[0].queue == "default"
    assert deck.store.list_jobs(JobFilter(type=THRESHOLD_TYPE), clock.now) == []


@pytest.mark.parametrize(
    "thresholds, message",
    [
        ({"latency": 5}, "alerts.thresholds.latency: unknown key"),
        ({"queue_latency": 0}, "alerts.thresholds.queue_latency: must be a number > 0, got 0"),
        ({"queue_latency": "5s"}, "alerts.thresholds.queue_latency: must be a number > 0"),
        ({"queue_latency": True}, "alerts.thresholds.queue_latency: must be a number > 0"),
        ({"failure_rate": 150}, "alerts.thresholds.failure_rate: a percentage, at most 100"),
        ({"failure_window": 10}, "alerts.thresholds.failure_window: seconds from 60"),
        ({"failure_min_runs": 2.5}, "alerts.thresholds.failure_min_runs: must be an integer >= 1"),
        ({"no_live_workers": "default"}, "alerts.thresholds.no_live_workers: expected a list"),
        ({"no_live_workers": []}, "alerts.thresholds.no_live_workers: expected a list"),
        ({"no_live_workers": ["a\x00b"]}, "is not a queue name"),
        ({"no_live_workers": ["x" * 101]}, "is not a queue name"),
    ],
)
def test_bad_thresholds_are_refused_naming_the_key(make_config, registry, thresholds, message):
    with pytest.raises(ConfigError) as err:
        Jobdeck(make_config(alerts={"thresholds": thresholds}), registry)
    assert message in str(err.value)


def test_thresholds_must_be_a_table(make_config, registry):
    with pytest.raises(ConfigError, match=r"alerts.thresholds: expected a table"):
        Jobdeck(make_config(alerts={"thresholds": 5}), registry)


def test_the_window_reads_only_its_minutes(make_deck, clock, port):
    deck = make_deck(clock=clock, alerts=settings(port, failure_rate=50, failure_window=600, failure_min_runs=1))
    deck.maintenance.rollup_once(clock.now)
    _finish(deck, clock, "demo.fail", 3, ok=False)
    clock.advance(120)
    deck.maintenance.rollup_once(clock.now)
    assert deck.thresholds.check_once(clock.now) == [("failure_rate:demo.fail", True)]
    clock.advance(timedelta(minutes=12).total_seconds())  # the failures left the window
    assert deck.thresholds.check_once(clock.now) == [("failure_rate:demo.fail", False)]


def test_due_queues_is_a_seek_per_queue(make_deck, clock):
    from jobdeck.store.metrics import due_queues

    deck = make_deck(clock=clock)
    for name in ["b", "a", "a", "c", "z"]:
        deck.enqueue("demo.noop", queue=name)
    deck.enqueue("demo.noop", queue="later", delay_seconds=60)
    [running] = deck.store.claim("w", clock.now, queues=["z"])
    assert running.queue == "z"
    found = due_queues(deck.store, clock.now)
    assert found == ["a", "b", "c"]  # not "later" (not due yet), nor "z" (its job runs)
    assert due_queues(deck.store, clock.now, limit=2) == found[:2]


def hook_jobs(deck, clock, queue: str) -> int:
    jobs = deck.store.list_jobs(JobFilter(type=THRESHOLD_TYPE, limit=50), clock.now)
    return sum(1 for j in jobs if j.payload["queue"] == queue)


def on_mail(moves: list) -> list:
    """The moves of queue mail's alert (the alert queue's own waiting jobs may alert too)."""
    return [m for m in moves if m[0] == "queue_latency:mail"]


def test_a_superseded_message_is_not_sent_after_the_webhook_was_down(make_deck, clock, port):
    """The tester's reproduction: the webhook is down while an alert fires,
    recovers and fires again; once it is up, only the latest move is sent."""
    deck = make_deck(clock=clock, alerts=settings(port, queue_latency=5))

    def attempt() -> list:  # nothing listens on the port yet: each message fails while it is the latest
        return [(j.payload["event"], j.status) for j in deliver(deck, clock) if j.payload["queue"] == "mail"]

    deck.enqueue("demo.noop", queue="mail")  # nothing claims from "mail": its latency grows
    clock.advance(6)
    first = clock.now
    assert on_mail(deck.thresholds.check_once(clock.now)) == [("queue_latency:mail", True)]
    assert attempt() == [("threshold.firing", State.FAILED)]
    [job] = deck.store.claim("w", clock.now, queues=["mail"])
    deck.store.complete(job.id, "w", clock.now)
    clock.advance(1)
    assert on_mail(deck.thresholds.check_once(clock.now)) == [("queue_latency:mail", False)]
    assert sorted(attempt()) == [("threshold.firing", State.FAILED), ("threshold.recovered", State.FAILED)]
    deck.enqueue("demo.noop", queue="mail")
    clock.advance(6)
    last = clock.now
    assert on_mail(deck.thresholds.check_once(clock.now)) == [("queue_latency:mail", True)]
    [row] = [s for k, s in threshold_states(deck.store).items() if k == "queue_latency:mail"]
    assert row.firing and row.changed_at == last
    assert hook_jobs(deck, clock, "mail") == 3

    hook = Hook(port)
    try:
        clock.advance(3600)  # past every backoff: the three retry in one round, in whatever order
        done = {j.payload["at"]: j for j in deliver(deck, clock) if j.payload["queue"] == "mail"}
        assert len(done) == 3 and {j.status for j in done.values()} == {State.COMPLETED}
        [message] = [m for m in sent(hook) if m["queue"] == "mail"]
        assert message["event"] == "threshold.firing" and message["at"] == last.isoformat()
        assert done[last.isoformat()].result["sent"] is True
        stale = [j.result for at, j in done.items() if at != last.isoformat()]
        assert [r["sent"] for r in stale] == [False, False]
        assert all(r["reason"] == f"superseded by threshold.firing at {last.isoformat()}" for r in stale)
        assert done[first.isoformat()].result["event"] == "threshold.firing"
    finally:
        hook.close()


def test_the_latest_move_is_sent_when_it_is_a_recovery(make_deck, clock, port):
    """Firing while the webhook is down, recovered once it is up again: the
    firing message retried after the recovery was sent is skipped."""
    deck = make_deck(clock=clock, alerts=settings(port, no_live_workers=["reports"]))
    assert deck.thresholds.check_once(clock.now) == [("no_live_workers:reports", True)]
    assert [j.status for j in deliver(deck, clock)] == [State.FAILED]
    hook = Hook(port)
    try:
        deck.store.register_worker("reports", "h", 1, 1, clock.now, queues=["reports"])
        clock.advance(1)
        assert deck.thresholds.check_once(clock.now) == [("no_live_workers:reports", False)]
        deliver(deck, clock)  # the recovery is due now; the firing one still backs off
        assert [m["event"] for m in sent(hook)] == ["threshold.recovered"]
        clock.advance(3600)
        jobs = deliver(deck, clock)
        assert [m["event"] for m in sent(hook)] == ["threshold.recovered"]  # never the stale firing after it
        firing = next(j for j in jobs if j.payload["event"] == "threshold.firing")
        assert firing.status == State.COMPLETED and firing.result["sent"] is False
        assert firing.result["reason"].startswith("superseded by threshold.recovered at ")
    finally:
        hook.close()


class GatedHook:
    """A webhook whose first request waits on ``gate`` before it is read: a
    message already on its way (a slow network) while a newer one is due."""

    def __init__(self, port: int) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received: list[dict] = []
        self.gate = threading.Event()
        self.waiting = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if not hook.waiting.is_set():
                    hook.waiting.set()
                    hook.gate.wait(10)
                hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def test_with_concurrency_one_a_message_in_flight_still_arrives_first(make_deck, clock, port):
    """The check runs before the POST, so a newer message could overtake one
    already in flight; ``[types."jobdeck.threshold"] concurrency = 1`` rules
    that out across processes: the newer one is not claimed until it lands."""
    limits = {"jobdeck.threshold": {"concurrency": 1}}
    a, b = (make_deck(clock=clock, alerts=settings(port, no_live_workers=["reports"]), types=limits) for _ in "ab")
    hook = GatedHook(port)
    try:
        assert a.thresholds.check_once(clock.now) == [("no_live_workers:reports", True)]
        pool_a = pool_for(a, 1, worker_id="alerter-a", queues=["jobdeck"])
        assert pool_a.fetch_once(clock.now) == 1
        posting = threading.Thread(target=lambda: pool_a.run_job(pool_a.holdings.work.get_nowait()))
        posting.start()
        wait_for(hook.waiting.is_set, 10, message="the firing message on its way")
        b.store.register_worker("reports", "h", 1, 1, clock.now, queues=["reports"])
        clock.advance(1)
        assert b.thresholds.check_once(clock.now) == [("no_live_workers:reports", False)]
        pool_b = pool_for(b, 1, worker_id="alerter-b", queues=["jobdeck"])
        assert pool_b.fetch_once(clock.now) == 0  # the firing message is still running
        hook.gate.set()
        posting.join(10)
        pool_a.flush_acks_once(clock.now)
        assert pool_b.fetch_once(clock.now) == 1
        pool_b.run_job(pool_b.holdings.work.get_nowait())
        assert [m["event"] for m in hook.received] == ["threshold.firing", "threshold.recovered"]
    finally:
        hook.close()
