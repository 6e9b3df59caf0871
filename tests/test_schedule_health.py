"""Schedule health, the dead man's switch: a schedule with no success within
``expect_success_within`` (or ``alert_after_failures`` failures in a row)
alerts once through the alert pipeline and recovers once; a missed fire, a
run still pending or running, and failed runs each say so; several processes
checking at once send each message once. On both databases."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.alerts import ALERT_TYPE
from jobdeck.maintenance.schedule_health import RECOVERED, UNHEALTHY
from jobdeck.runtime import Runtime
from jobdeck.store import JobFilter, Outcome

from tests.conftest import wait_for
from tests.openapi_check import check
from tests.test_alerts import Hook, free_port

pytestmark = pytest.mark.backends

HOURLY = {"name": "hourly", "cron": "0 * * * *", "type": "demo.noop", "expect_success_within": "90m"}


def _alerts(deck: Jobdeck, clock) -> list:
    jobs = deck.store.list_jobs(JobFilter(type=ALERT_TYPE, limit=50), clock.now)
    return sorted((j for j in jobs if "body" in j.payload), key=lambda j: j.id)


def _hook_config(port: int) -> dict:
    return {"webhook_url": f"http://127.0.0.1:{port}/hook", "window": 300, "timeout": 2, "backoff_base": 0.2,
            "dashboard_url": "http://jobs.example"}  # fmt: skip


@pytest.mark.slow
def test_a_failing_schedule_alerts_once_then_recovers_once_at_a_real_webhook(make_deck, registry):
    port = free_port()
    hook = Hook(port)
    healthy = threading.Event()

    @registry.handler("health.nightly", max_retries=0)
    def nightly(payload, ctx):
        if not healthy.is_set():
            raise RuntimeError("the report database is down")
        return {"ok": True}

    schedule = {"name": "nightly", "cron": "* * * * * *", "type": "health.nightly", "expect_success_within": "3s"}
    deck = make_deck(schedules=[schedule], alerts=_hook_config(port), workers=2)
    runtime = Runtime(deck, workers=2)
    runtime.start()
    try:

        def events(kind: str) -> list[dict]:
            return [m for m in list(hook.received) if m.get("event") == kind]

        wait_for(lambda: events(UNHEALTHY), 30, interval=0.05, message="the unhealthy alert")
        down = events(UNHEALTHY)[0]
        assert down["schedule"] == "nightly" and down["dashboard"] == "http://jobs.example/schedules"
        assert down["reason"].startswith("no successful run within 3s: run #")
        assert "the report database is down" in down["reason"]
        wait_for(lambda: len(deck.store.list_jobs(JobFilter(type="health.nightly", status=State.DEAD, limit=50),
                                                  deck.clock())) >= 6, 20, message="more failed runs")  # fmt: skip
        assert len(events(UNHEALTHY)) == 1  # failures go on: still the one alert
        api = {s["name"]: s for s in _api_schedules(deck)}
        assert api["nightly"]["health"]["healthy"] is False and "report database" in api["nightly"]["health"]["reason"]

        healthy.set()
        wait_for(lambda: events(RECOVERED), 30, interval=0.05, message="the recovery")
        up = events(RECOVERED)[0]
        assert up["schedule"] == "nightly" and up["text"].startswith("schedule nightly recovered: a run succeeded at")
        wait_for(lambda: len(deck.store.list_jobs(JobFilter(type="health.nightly", status=State.COMPLETED, limit=50),
                                                  deck.clock())) >= 3, 20, message="more good runs")  # fmt: skip
        assert len(events(UNHEALTHY)) == 1 and len(events(RECOVERED)) == 1
        assert [m["event"] for m in hook.received if m["event"].startswith("schedule.")] == [UNHEALTHY, RECOVERED]
    finally:
        runtime.stop(grace=5)
        hook.close()


def _api_schedules(deck: Jobdeck) -> list[dict]:
    from jobdeck import create_app

    client = create_app(deck=deck, init_db=False).test_client()
    return check(client.get("/api/schedules"), "/api/schedules", "get")["schedules"]


def test_a_missed_fire_alerts_from_one_process_and_recovers_once(make_deck, clock):
    port = free_port()
    a = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    b = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    assert a.schedule_health.check_once(clock.now) == []  # watched from now
    clock.advance(89 * 60)
    assert a.schedule_health.check_once(clock.now) == []
    clock.advance(2 * 60)  # Jobdeck was down: the 13:00 and 14:00 fires never happened
    assert b.schedule_health.check_once(clock.now) == [(UNHEALTHY, "hourly")]
    assert a.schedule_health.check_once(clock.now) == []
    (alert,) = _alerts(a, clock)
    body = alert.payload["body"]
    assert body["event"] == UNHEALTHY and body["since"] == "2026-01-01T12:00:00Z"
    assert body["reason"] == "no successful run within 1h30m: no run fired since 2026-01-01T12:00:00Z " \
                             "(a missed fire: was Jobdeck down?)"  # fmt: skip
    assert alert.queue == "jobdeck" and alert.idempotency_key.startswith("schedule.unhealthy:hourly:")

    # Jobdeck is back: the 14:00 fire is caught up (misfire run_once) and succeeds.
    (job_id,) = a.schedules.enqueue_due_once(clock.now)
    assert b.schedule_health.check_once(clock.advance(1)) == []  # pending: no success yet
    (job,) = a.store.claim("w", clock.now, types=["demo.noop"])
    a.store.complete_many([Outcome(job.id, "w", attempt=job.attempt)], clock.advance(1))
    won = [d.schedule_health.check_once(clock.advance(1)) for d in (a, b)]
    assert won == [[(RECOVERED, "hourly")], []]
    alerts = _alerts(a, clock)
    assert [j.payload["body"]["event"] for j in alerts] == [UNHEALTHY, RECOVERED]
    assert a.schedule_health.check_once(clock.advance(60)) == []
    assert a.schedule_health.view()["hourly"]["last_success"] is not None


def test_pending_running_and_failed_runs_each_say_why(make_deck, clock):
    every = {"name": "every", "cron": "* * * * *", "type": "demo.noop", "expect_success_within": "3m"}
    fails = {"name": "fails", "cron": "* * * * *", "type": "demo.fail", "alert_after_failures": 2, "max_retries": 0}
    deck = make_deck(clock, schedules=[every, fails])
    deck.schedule_health.check_once(clock.now)
    deck.schedules.enqueue_due_once(clock.advance(60))
    (run,) = deck.store.claim("w", clock.now, types=["demo.fail"])
    deck.store.fail_many([Outcome(run.id, "w", attempt=1, error="RuntimeError: first")], clock.now)
    assert deck.schedule_health.check_once(clock.advance(1)) == []  # one failure of two; "every" waits
    clock.advance(59)
    deck.schedules.enqueue_due_once(clock.now)
    (run,) = deck.store.claim("w", clock.now, types=["demo.fail"])
    deck.store.fail_many([Outcome(run.id, "w", attempt=1, error="RuntimeError: second")], clock.now)
    assert deck.schedule_health.check_once(clock.advance(1)) == [(UNHEALTHY, "fails")]
    assert deck.schedule_health.view()["fails"]["reason"] == f"the last 2 runs failed; latest #{run.id}: " \
                                                             "RuntimeError: second"  # fmt: skip
    (waiting, _) = sorted(deck.store.list_jobs(JobFilter(type="demo.noop", limit=5), clock.now), key=lambda j: -j.id)
    clock.advance(60)
    assert deck.schedule_health.check_once(clock.now) == [(UNHEALTHY, "every")]
    assert f"run #{waiting.id} (fired 2026-01-01T12:02:00Z) is still waiting to start" in deck.schedule_health.view()[
        "every"]["reason"]  # fmt: skip


def test_a_running_run_too_long_and_a_paused_schedule(make_deck, clock):
    slow = {"name": "slow", "cron": "0 * * * *", "type": "demo.noop", "expect_success_within": "30m"}
    quiet = {**slow, "name": "quiet"}
    deck = make_deck(clock, schedules=[slow, quiet])
    deck.schedule_health.check_once(clock.now)
    deck.schedules.set_paused("quiet", True, clock.now, "test")
    deck.schedules.enqueue_due_once(clock.advance(3600))
    deck.store.claim("w", clock.now, types=["demo.noop"])
    assert deck.schedule_health.check_once(clock.advance(60)) == [(UNHEALTHY, "slow")]
    reason = deck.schedule_health.view()["slow"]["reason"]
    assert "is still running (since 2026-01-01T13:00:00Z)" in reason
    assert deck.schedule_health.view()["quiet"]["healthy"] is True  # paused: silence is expected


def test_processes_checking_at_once_flip_it_once(make_deck, clock):
    port = free_port()
    decks = [make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port)) for _ in range(4)]
    decks[0].schedule_health.check_once(clock.now)
    clock.advance(2 * 3600)
    barrier = threading.Barrier(len(decks))
    won: list = []

    def check_now(d: Jobdeck) -> None:
        barrier.wait()
        won.extend(d.schedule_health.check_once(clock.now))

    threads = [threading.Thread(target=check_now, args=(d,)) for d in decks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert won == [(UNHEALTHY, "hourly")]
    assert len(_alerts(decks[0], clock)) == 1


def test_the_schedules_page_marks_the_unhealthy_one(make_deck, clock):
    from dashboard_support import make_dash_app

    deck = make_deck(clock, schedules=[HOURLY, {**HOURLY, "name": "fine", "expect_success_within": "26h"}])
    deck.schedule_health.check_once(clock.now)
    deck.schedule_health.check_once(clock.advance(timedelta(hours=2).total_seconds()))
    html = make_dash_app(deck).test_client().get("/schedules").get_data(as_text=True)
    row = html[html.index('data-schedule="hourly"') : html.index('data-schedule="fine"')]
    assert (
        "is-unhealthy" in html[html.index('data-schedule="hourly"') - 200 : html.index('data-schedule="hourly"') + 200]
    )
    assert ">unhealthy</span>" in row and "no run fired since 2026-01-01T12:00:00Z" in row
    assert ">healthy</span>" in html[html.index('data-schedule="fine"') :]


def test_a_process_dying_between_the_alert_and_the_flip_loses_nothing_and_sends_once(make_deck, clock, monkeypatch):
    import jobdeck.maintenance.schedule_health as health

    port = free_port()
    a = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    b = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    a.schedule_health.check_once(clock.now)
    clock.advance(2 * 3600)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed after enqueueing the alert")

    with monkeypatch.context() as m:
        m.setattr(health, "mark_unhealthy", crash)
        with pytest.raises(KeyboardInterrupt):
            a.schedule_health.check_once(clock.now)
    assert len(_alerts(a, clock)) == 1 and a.schedule_health.view()["hourly"]["healthy"] is True
    assert b.schedule_health.check_once(clock.advance(1)) == [(UNHEALTHY, "hourly")]
    assert len(_alerts(a, clock)) == 1  # the same job, found by its key


def _deliver(deck: Jobdeck, clock) -> list[tuple[str, State]]:
    """Run the due alert jobs through a worker pool's own steps (the alert
    queue only); the (event, state) of each schedule health message after."""
    from jobdeck.runtime import pool_for

    pool = pool_for(deck, 1, worker_id="alerter", queues=["jobdeck"])
    while pool.fetch_once(clock.now):
        while not pool.holdings.work.empty():
            pool.run_job(pool.holdings.work.get_nowait())
        pool.flush_acks_once(clock.now)
    return [(j.payload["body"]["event"], j.status) for j in _alerts(deck, clock)]


def _run(deck: Jobdeck, clock, *, ok: bool = True) -> None:
    """The due fire (a missed one is caught up) runs and succeeds or fails."""
    deck.schedules.enqueue_due_once(clock.now)
    (job,) = deck.store.claim("w", clock.now, types=["demo.noop"])
    if ok:
        deck.store.complete_many([Outcome(job.id, "w", attempt=job.attempt)], clock.advance(1))
    else:
        deck.store.fail_many([Outcome(job.id, "w", attempt=job.attempt, error="RuntimeError: down")], clock.advance(1))


def _schedule_messages(hook: Hook) -> list[dict]:
    return [m for m in hook.received if str(m.get("event", "")).startswith("schedule.")]


def test_a_superseded_message_is_not_sent_after_the_webhook_was_down(make_deck, clock):
    """The tester's reproduction for schedule health: with the webhook down,
    the schedule goes unhealthy, recovers, and goes unhealthy again, each
    message failing while it is the newest; once the webhook is up, all three
    retry in one round and only the newest is sent, never a stale recovery."""
    port = free_port()
    minutely = {"name": "minutely", "cron": "* * * * *", "type": "demo.noop", "alert_after_failures": 1}
    deck = make_deck(clock, schedules=[minutely], alerts={**_hook_config(port), "backoff_base": 600})
    deck.schedule_health.check_once(clock.now)
    steps = [(False, UNHEALTHY), (True, RECOVERED), (False, UNHEALTHY)]
    for n, (ok, event) in enumerate(steps, 1):
        _run(deck, clock.advance(60) and clock, ok=ok)
        assert deck.schedule_health.check_once(clock.advance(1)) == [(event, "minutely")]
        assert _deliver(deck, clock) == [(e, State.FAILED) for _, e in steps[:n]]  # nothing listens on the port
    assert deck.schedule_health.view()["minutely"]["healthy"] is False

    hook = Hook(port)
    try:
        clock.advance(3600)  # past every backoff
        assert _deliver(deck, clock) == [(e, State.COMPLETED) for _, e in steps]
        [message] = _schedule_messages(hook)
        first, recovery, second = _alerts(deck, clock)
        assert message == second.payload["body"] and second.result["sent"] is True
        assert message["since"] != first.payload["body"]["since"]
        for stale in (first, recovery):
            assert stale.result["sent"] is False
            assert stale.result["reason"] == f"superseded by {UNHEALTHY} (the episode since {message['since']})"
    finally:
        hook.close()


def test_the_newest_message_is_sent_when_it_is_a_recovery(make_deck, clock):
    """Unhealthy while the webhook is down, recovered once it is up: the
    alert retried after the recovery was sent is skipped, not sent stale."""
    port = free_port()
    deck = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    deck.schedule_health.check_once(clock.now)
    assert deck.schedule_health.check_once(clock.advance(91 * 60)) == [(UNHEALTHY, "hourly")]
    assert _deliver(deck, clock) == [(UNHEALTHY, State.FAILED)]
    hook = Hook(port)
    try:
        _run(deck, clock)
        assert deck.schedule_health.check_once(clock.now) == [(RECOVERED, "hourly")]
        _deliver(deck, clock)  # the recovery is due now; the alert may still back off
        clock.advance(3600)
        assert _deliver(deck, clock) == [(UNHEALTHY, State.COMPLETED), (RECOVERED, State.COMPLETED)]
        assert [m["event"] for m in _schedule_messages(hook)] == [RECOVERED]
        alert, _ = _alerts(deck, clock)
        assert alert.result["sent"] is False and alert.result["reason"].startswith(f"superseded by {RECOVERED} at ")
    finally:
        hook.close()


def test_an_alert_whose_episode_a_success_ended_is_not_sent(make_deck, clock, monkeypatch):
    """A process died between enqueueing the alert and flipping it, and the
    next check found a success: no flip, no recovery to follow; the orphan
    alert is not sent (the schedule is healthy)."""
    import jobdeck.maintenance.schedule_health as health

    port = free_port()
    deck = make_deck(clock, schedules=[HOURLY], alerts=_hook_config(port))
    deck.schedule_health.check_once(clock.now)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed after enqueueing the alert")

    with monkeypatch.context() as m:
        m.setattr(health, "mark_unhealthy", crash)
        with pytest.raises(KeyboardInterrupt):
            deck.schedule_health.check_once(clock.advance(91 * 60))
    _run(deck, clock)
    assert deck.schedule_health.check_once(clock.advance(1)) == []
    hook = Hook(port)
    try:
        assert _deliver(deck, clock) == [(UNHEALTHY, State.COMPLETED)]
        assert _schedule_messages(hook) == []
        (alert,) = _alerts(deck, clock)
        assert alert.result["reason"].startswith("superseded by a successful run at ")
    finally:
        hook.close()
