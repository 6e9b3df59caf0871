"""Schedules made at runtime: the API's create/edit/delete, validated like
the config file (422 with the reason), config names owned by the config
(409), every change in the audit log with its diff, the dashboard's forms
with CSRF, pick-up by another process, and one job per fire time across two
real processes on both databases."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.store import Store
from jobdeck.store.audit import list_audit
from jobdeck.store.engine import make_engine
from jobdeck.store.models import jobs, schedule_runs
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import wait_for
from tests.openapi_check import check
from tests.two_processes import TwoProcesses

pytestmark = pytest.mark.backends

CONFIG_SCHEDULES = [{"name": "nightly", "cron": "0 2 * * *", "type": "demo.report"}]
TICK = {"name": "tick", "cron": "*/5 * * * *", "type": "demo.noop", "payload": {"n": 1}}


@pytest.fixture
def rt(make_config, registry, clock):
    deck = Jobdeck(make_config(schedules=CONFIG_SCHEDULES), registry, clock=clock)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    yield deck, app.test_client()
    deck.store.engine.dispose()


def _audit(deck: Jobdeck) -> list[tuple[str, str]]:
    return [(e.action, e.detail or "") for e in list_audit(deck.store)[0]]


def test_create_edit_delete_through_the_api_with_the_audit_diff(rt, clock):
    deck, client = rt
    made = check(client.post("/api/schedules", json=TICK), "/api/schedules", "post")
    assert made["source"] == "runtime" and made["description"] == "every 5 minutes (UTC)"
    assert made["definition"]["payload"] == {"n": 1} and made["next_run"] == "2026-01-01T12:05:00Z"
    listed = {s["name"]: s for s in check(client.get("/api/schedules"), "/api/schedules", "get")["schedules"]}
    assert listed["nightly"]["source"] == "config" and listed["tick"]["source"] == "runtime"

    edit = {"cron": "0 3 * * *", "type": "demo.noop", "timezone": "Europe/Paris", "expect_success_within": "26h"}
    edited = check(client.put("/api/schedules/tick", json=edit), "/api/schedules/{name}", "put")
    assert edited["description"] == "every day at 03:00 Europe/Paris"
    assert edited["health"] == {**edited["health"], "watched": True, "healthy": True, "expect_success_within": 93600}
    action, detail = _audit(deck)[0]
    assert action == "schedule.update"
    assert 'cron: "*/5 * * * *" → "0 3 * * *"' in detail and 'payload: {"n": 1} → (none)' in detail
    assert 'timezone: (none) → "Europe/Paris"' in detail and 'expect_success_within: (none) → "26h"' in detail

    assert check(client.delete("/api/schedules/tick"), "/api/schedules/{name}", "delete") == {"deleted": "tick"}
    assert [a for a, _ in _audit(deck)] == ["schedule.delete", "schedule.update", "schedule.create"]
    assert (
        _audit(deck)[2][1]
        == 'tick: cron: (none) → "*/5 * * * *"; payload: (none) → {"n": 1}; type: (none) → "demo.noop"'
    )
    assert deck.schedules.enqueue_due_once(clock.advance(3600)) == []  # gone: it fires no more
    for method in ("put", "delete"):
        r = getattr(client, method)("/api/schedules/tick", json=TICK)
        assert check(r, "/api/schedules/{name}", method)["error"] == "no schedule named 'tick'"


def test_a_runtime_schedule_fires_through_the_same_key_and_pauses(rt, clock):
    deck, client = rt
    client.post("/api/schedules", json={**TICK, "cron": "* * * * *"})
    ids = deck.schedules.enqueue_due_once(clock.advance(60))
    job = deck.store.get(ids[0])
    assert job.idempotency_key == "schedule:tick:2026-01-01T12:01:00+00:00" and job.payload == {"n": 1}
    assert client.post("/api/schedules/tick/pause").get_json()["paused"] is True
    assert deck.schedules.enqueue_due_once(clock.advance(120)) == []
    client.post("/api/schedules/tick/resume")
    assert len(deck.schedules.enqueue_due_once(clock.advance(60))) == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({**TICK, "cron": "* * * *"}, "invalid cron expression '* * * *': expected 5 fields"),
        ({**TICK, "cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({**TICK, "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({**TICK, "type": "no.such"}, "unknown job type 'no.such' (no handler registered)"),
        ({**TICK, "colour": "red"}, "unknown key 'colour'"),
        ({**TICK, "payload": [1]}, "payload"),
        ({**TICK, "expect_success_within": "soon"}, "expect_success_within: expected a duration"),
        ({**TICK, "expect_success_within": 0}, "expect_success_within: must be more than 0 seconds"),
        ({**TICK, "alert_after_failures": 0}, "alert_after_failures: must be a whole number from 1"),
        ({**TICK, "misfire": "always"}, "misfire: must be one of run_once, skip"),
        ({**TICK, "max_retries": -1}, "max_retries"),
        ({**TICK, "name": ""}, "name: required"),
        ({**TICK, "name": "x" * 201}, "name: required, a string of 1 to 200 characters"),
        ({"cron": "* * * * *", "type": "demo.noop"}, "name: required"),
    ],
)
def test_invalid_schedules_are_refused_with_422_saying_why(rt, body, says):
    deck, client = rt
    r = client.post("/api/schedules", json=body)
    assert check(r, "/api/schedules", "post") and r.status_code == 422
    assert says in r.get_json()["error"]
    assert _audit(deck) == [] and deck.schedules.all().keys() == {"nightly"}


def test_config_names_belong_to_the_config(rt):
    deck, client = rt
    for r, path, method in (
        (client.post("/api/schedules", json={**TICK, "name": "nightly"}), "/api/schedules", "post"),
        (client.put("/api/schedules/nightly", json=TICK), "/api/schedules/{name}", "put"),
        (client.delete("/api/schedules/nightly"), "/api/schedules/{name}", "delete"),
    ):
        assert r.status_code == 409, method
        assert "comes from the configuration file" in check(r, path, method)["error"]
    assert deck.schedules.get("nightly").cron == "0 2 * * *"
    check(client.post("/api/schedules", json=TICK), "/api/schedules", "post")
    again = client.post("/api/schedules", json=TICK)
    assert again.status_code == 409 and "exists already" in again.get_json()["error"]
    renamed = client.put("/api/schedules/tick", json={**TICK, "name": "tock"})
    assert renamed.status_code == 422 and "cannot be renamed" in renamed.get_json()["error"]


def test_the_api_token_guards_the_changes(make_config, registry, clock):
    deck = Jobdeck(make_config(api_token="s3cret"), registry, clock=clock)
    client = create_app(deck=deck).test_client()
    assert client.post("/api/schedules", json=TICK).status_code == 401
    assert client.delete("/api/schedules/tick").status_code == 401
    ok = client.post("/api/schedules", json=TICK, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201
    deck.store.engine.dispose()


def _token(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def test_the_dashboard_creates_edits_and_deletes_with_csrf(rt, clock):
    deck, client = rt
    page = client.get("/schedules/new").get_data(as_text=True)
    form = {"name": "reports/ü nightly", "cron": "30 1 * * *", "timezone": "UTC", "type": "demo.noop",
            "payload": '{"x": "<b>"}', "expect_success_within": "2h", "enabled": "on"}  # fmt: skip
    assert client.post("/schedules/new", data=form).status_code == 400  # no CSRF token
    refused = client.post("/schedules/new", data={**form, "cron": "nope", "csrf_token": _token(page)})
    html = refused.get_data(as_text=True)
    assert refused.status_code == 422 and "invalid cron expression" in html and 'value="nope"' in html
    r = client.post("/schedules/new", data={**form, "csrf_token": _token(page)})
    assert r.status_code == 303 and r.headers["Location"].endswith("/schedules")
    listing = client.get("/schedules").get_data(as_text=True)
    assert "reports/ü nightly: created; it fires every day at 01:30 UTC" in listing
    assert ">runtime</span>" in listing and ">from config</span>" in listing and "<b>" not in listing
    edit_url = "/schedules/reports/%C3%BC%20nightly/edit"
    assert f'href="{edit_url}"' in listing
    page = client.get(edit_url).get_data(as_text=True)
    assert "&#34;x&#34;: &#34;&lt;b&gt;&#34;" in page and 'value="2h"' in page
    r = client.post(edit_url, data={**form, "cron": "45 1 * * *", "csrf_token": _token(page)})
    assert r.status_code == 303 and deck.schedules.get("reports/ü nightly").cron == "45 1 * * *"
    assert client.get("/schedules/nightly/edit").status_code == 409
    r = client.post("/schedules/reports/%C3%BC%20nightly/delete", data={"csrf_token": _token(page)})
    assert r.status_code == 303 and "reports/ü nightly" not in deck.schedules.all()
    assert [a for a, _ in _audit(deck)] == ["schedule.delete", "schedule.update", "schedule.create"]


def test_another_process_picks_the_change_up_within_a_poll(make_deck, clock):
    a = make_deck(clock, poll_interval=0.05)
    b = make_deck(clock, poll_interval=0.05)
    assert b.schedules.all() == {}
    a.runtime_schedules.create({**TICK, "cron": "* * * * *"}, "api", clock.now)
    wait_for(lambda: "tick" in b.schedules.all(), 5, message="b sees the new schedule")
    fire = clock.now + timedelta(seconds=60)
    ids = [d.schedules.enqueue_due_once(fire) for d in (a, b)]
    assert len(ids[0]) == 1 and ids[1] in ([], ids[0])  # one job for the fire time, whoever fires it
    a.runtime_schedules.update("tick", {**TICK, "cron": "0 0 1 1 *"}, "api", clock.now)
    wait_for(lambda: b.schedules.all()["tick"].cron == "0 0 1 1 *", 5, message="b sees the edit")
    a.runtime_schedules.delete("tick", "api", clock.now)
    wait_for(lambda: "tick" not in b.schedules.all(), 5, message="b sees the delete")


@pytest.mark.slow
def test_fires_once_per_fire_time_across_two_real_processes(db_url, tmp_path):
    procs = TwoProcesses(db_url, tmp_path)
    engine = make_engine(db_url, pool_size=2)
    store = Store(engine)
    key = "schedule:rt-tick:%"
    try:
        wait_for(procs.up, 60, interval=0.2, message="both processes serve")
        status, body = procs.call("POST", "/api/schedules", {"name": "rt-tick", "cron": "* * * * * *",
                                                              "type": "demo.noop"})  # fmt: skip
        assert status == 201, body
        created = datetime.now(UTC)

        def fired() -> int:
            procs.check_alive(1)
            try:
                with store.read() as conn:
                    stmt = select(func.count()).where(jobs.c.idempotency_key.like(key))
                    return int(conn.execute(stmt).scalar_one())
            except SQLAlchemyError:
                return 0

        wait_for(lambda: fired() >= 4, 60, interval=0.2, message="four fire times")
        wait_for(lambda: all("changed: rt-tick" in log.read_text() for log in procs.logs), 20,
                 interval=0.2, message="both processes pick it up")  # fmt: skip
        procs.procs[0].terminate()  # the process it was made on goes away: the other fires it on
        procs.procs[0].wait(30)
        before = fired()
        wait_for(lambda: fired() >= before + 3, 30, interval=0.2, message="fires from the second process")
        assert "schedule rt-tick fired" in procs.logs[1].read_text()
        with store.read() as conn:
            rows = conn.execute(select(jobs.c.idempotency_key).where(jobs.c.idempotency_key.like(key))).all()
            runs = conn.execute(select(func.count()).where(schedule_runs.c.schedule == "rt-tick")).scalar_one()
        keys = [r.idempotency_key for r in rows]
        span = (datetime.now(UTC) - created).total_seconds()
        assert len(keys) == len(set(keys)) and len(keys) <= span + 2, f"{len(keys)} jobs in {span:.1f} s"
        assert runs >= len(keys) - 2  # one run row per fire time (a fire in flight may trail)
    finally:
        procs.stop()
        engine.dispose()


def test_a_viewer_can_look_but_not_change_schedules(make_config, registry, clock):
    from dashboard_support import make_dash_app

    from tests.helpers import password_hash

    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    deck = Jobdeck(make_config(), registry, clock=clock)
    deck.init_db()
    client = make_dash_app(deck, users=users).test_client()
    page = client.get("/login").get_data(as_text=True)
    client.post("/login", data={"username": "victor", "password": "victor-secret", "csrf_token": _token(page)})
    listing = client.get("/schedules").get_data(as_text=True)
    assert "New schedule" not in listing
    refused = client.post("/api/schedules", json=TICK, headers={"Origin": "http://localhost"})
    assert refused.status_code == 403 and "viewer" in refused.get_json()["error"]
    form = client.post("/schedules/new", data={**TICK, "payload": "{}", "csrf_token": _token(listing)},
                       headers={"HX-Request": "true"})  # fmt: skip
    assert form.status_code == 403 and "only operators can act" in form.get_data(as_text=True)
    assert deck.schedules.all() == {} and _audit(deck) == []
    deck.store.engine.dispose()
