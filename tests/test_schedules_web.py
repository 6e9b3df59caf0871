"""The Schedules page and its JSON twin, CSRF on its forms, the demo's
schedules, and the runtime starting the scheduler once."""

from __future__ import annotations

import re

import pytest
from jobdeck import create_app
from jobdeck.core.config import load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.runtime import Runtime

from tests.conftest import wait_for
from tests.openapi_check import check

SCHEDULES = [
    {"name": "sales-report", "cron": "0 2 * * *", "type": "demo.report", "payload": {"name": "sales<b>"}},
    {"name": "tick", "cron": "* * * * *", "type": "demo.noop"},
]


@pytest.fixture
def sched_client(make_config, registry, clock):
    deck = Jobdeck(make_config(schedules=SCHEDULES), registry, clock=clock)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    yield deck, app.test_client()
    deck.store.engine.dispose()


def token(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def test_page_shows_words_next_run_and_runs_and_acts_with_csrf(sched_client, clock):
    deck, client = sched_client
    page = client.get("/schedules").get_data(as_text=True)
    assert "every day at 02:00 UTC" in page and "every minute (UTC)" in page
    assert 'title="2026-01-02 02:00:00 UTC">in ' in page  # next run of the nightly report, exact on hover
    assert 'class="active" aria-current="page">Schedules' in page  # the dashboard's layout, its nav entry
    assert client.post("/schedules/sales-report/run").status_code == 400  # no CSRF token
    r = client.post("/schedules/sales-report/run", data={"csrf_token": token(page)})
    assert r.status_code == 303 and r.headers["Location"].endswith("/schedules")
    page = client.get("/schedules").get_data(as_text=True)
    job = deck.store.list_jobs(_all(), clock.now)[0]
    assert f'sales-report</bdi>: enqueued <a href="/jobs/{job.id}">job #{job.id}</a>' in page
    assert f'href="/jobs/{job.id}">#{job.id}</a>' in page and 'badge-pending">Pending' in page
    client.post("/schedules/tick/pause", data={"csrf_token": token(page)})
    listed = check(client.get("/api/schedules"), "/api/schedules", "get")
    api = {s["name"]: s for s in listed["schedules"]}
    assert api["tick"]["paused"] is True and api["tick"]["next_run"] is None
    assert api["sales-report"]["runs"][0]["job_id"] == job.id
    resumed = check(client.post("/api/schedules/tick/resume"), "/api/schedules/{name}/resume", "post")
    assert resumed["paused"] is False
    ran = check(client.post("/api/schedules/tick/run"), "/api/schedules/{name}/run", "post")
    assert ran["idempotency_key"].startswith("schedule:tick:manual:")
    check(client.post("/api/schedules/nope/run"), "/api/schedules/{name}/run", "post")
    assert client.post("/schedules/nope/run", data={"csrf_token": token(page)}).status_code == 404


def test_htmx_actions_answer_in_place_and_are_audited(sched_client):
    _, client = sched_client
    page = client.get("/schedules").get_data(as_text=True)
    headers = {"HX-Request": "true", "X-CSRFToken": token(page)}
    r = client.post("/schedules/tick/pause", headers=headers)
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and html.startswith('<div id="schedules-live"')
    assert 'hx-swap-oob="true"' in html and "tick: paused" in html and "badge-paused" in html
    assert ">Resume</button>" in html
    live = client.get("/fragments/schedules").get_data(as_text=True)
    assert live.startswith('<div id="schedules-live"') and "<html" not in live and "badge-paused" in live
    r = client.post("/queues/mail/pause", headers=headers)
    html = r.get_data(as_text=True)
    assert html.startswith('<div id="queues-live"') and "queue mail: paused" in html
    assert 'data-queue="mail" class="is-paused"' in html
    queues = client.get("/queues").get_data(as_text=True)
    assert 'aria-current="page">Queues' in queues and "Resume queue mail" in queues
    audit = client.get("/audit").get_data(as_text=True)
    assert "schedule.pause" in audit and "queue.pause" in audit


def test_queues_page_shows_counts_limits_and_type_limits(make_config, registry, clock):
    deck = Jobdeck(make_config(queues={"reports": {"concurrency": 1}}, types={"demo.sleep": {"concurrency": 2}}),
                   registry, clock=clock)  # fmt: skip
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    try:
        deck.enqueue("demo.sleep", {}, queue="reports")
        deck.enqueue("demo.noop", {}, queue="reports")
        deck.queues(deck.store, "w1", clock.now, limit=5)
        html = app.test_client().get("/queues").get_data(as_text=True)
        row = html[html.index('data-queue="reports"') :].split("</tr>")[0]
        assert [int(n) for n in re.findall(r'class="num">(\d+)<', row)] == [1, 1]  # waiting, running
        assert "at most 1 running" in row and "at limit" in row
        limits = html[html.index("Job type limits") :]
        assert "demo.sleep" in limits and "at most 2" in limits
        assert 'href="/jobs/pending?queue=reports"' in html
    finally:
        deck.store.engine.dispose()


def test_viewer_sees_no_schedule_or_queue_buttons_and_is_refused(make_config, registry, clock):
    from tests.helpers import password_hash

    users = {"victor": {"password_hash": password_hash("pw-victor"), "role": "viewer"}}
    deck = Jobdeck(make_config(schedules=SCHEDULES, users=users), registry, clock=clock)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    client = app.test_client()
    try:
        login_page = client.get("/login").get_data(as_text=True)
        client.post("/login", data={"username": "victor", "password": "pw-victor", "csrf_token": token(login_page)})
        schedules = client.get("/schedules").get_data(as_text=True)
        queues = client.get("/queues").get_data(as_text=True)
        assert "sales-report" in schedules and 'data-queue="default"' in queues
        assert '<button class="btn' not in schedules + queues  # no Run now, Pause or Resume for a viewer
        headers = {"HX-Request": "true", "X-CSRFToken": token(schedules)}  # the sign-out form's
        for url in ("/schedules/tick/pause", "/schedules/tick/run", "/queues/default/pause"):
            r = client.post(url, headers=headers)
            assert r.status_code == 403 and "only operators can act" in r.get_data(as_text=True)
        assert deck.schedules.overview(clock.now)[1]["paused"] is False
        assert deck.store.list_jobs(_all(), clock.now) == []
    finally:
        deck.store.engine.dispose()


def _all():
    from jobdeck.store import JobFilter

    return JobFilter(limit=10)


def test_demo_ships_a_nightly_report_an_every_minute_schedule_a_workflow_and_a_card_limit(tmp_path):
    config = load(env={}, overrides={"demo": True, "database_url": f"sqlite:///{tmp_path / 'd.db'}",
                                     "instance_path": str(tmp_path)})  # fmt: skip
    app = create_app(config)
    deck = app.extensions["jobdeck"]
    report, minute, nightly = deck.schedules.schedules.values()
    assert (report.type, report.describe()) == ("demo.report", "every day at 02:00 UTC")
    assert minute.cron == "* * * * *"
    assert nightly.workflow == "demo.nightly" and "demo.nightly" in deck.configured_workflows
    assert deck.queues.limits.types == {"demo.charge-card": 2}
    deck.store.engine.dispose()


def test_runtime_runs_the_scheduler_once_per_process(make_config, registry):
    config = make_config(schedules=[{"name": "secs", "cron": "* * * * * *", "type": "demo.noop"}])
    deck = Jobdeck(config, registry)
    app = create_app(deck=deck)
    runtime = Runtime.for_app(app, workers=1)
    other = Runtime.for_app(app, workers=0)
    runtime.start()
    try:
        with pytest.raises(RuntimeError):
            other.start()
        wait_for(lambda: deck.store.counts(deck.clock())[State.COMPLETED.value] >= 1, timeout=15)
    finally:
        runtime.stop(2)
    deck.store.engine.dispose()
