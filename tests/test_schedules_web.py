"""The Schedules page and its JSON twin, CSRF on its forms, the demo's
schedules, and the runtime starting the scheduler once."""

from __future__ import annotations

import re

import pytest

from app import create_app
from app.config import load
from app.runtime import Runtime
from app.service import Jobdeck
from app.states import State
from app.wiring import install
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
    assert "2026-01-02 02:00:00 UTC" in page  # next run of the nightly report
    assert client.post("/schedules/sales-report/run").status_code == 400  # no CSRF token
    r = client.post("/schedules/sales-report/run", data={"csrf_token": token(page)})
    assert r.status_code == 302
    page = client.get("/schedules").get_data(as_text=True)
    job = deck.store.list_jobs(_all(), clock.now)[0]
    assert f"sales-report: enqueued job #{job.id}" in page
    assert f">#{job.id}</a>" in page and 'badge-pending">pending' in page
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


def _all():
    from app.store import JobFilter

    return JobFilter(limit=10)


def test_demo_ships_a_nightly_report_an_every_minute_schedule_and_a_card_limit(tmp_path):
    config = load(env={}, overrides={"demo": True, "database_url": f"sqlite:///{tmp_path / 'd.db'}",
                                     "instance_path": str(tmp_path)})  # fmt: skip
    app = create_app(config)
    ops = install(app.extensions["jobdeck"])
    report, minute = ops.periodic.schedules.values()
    assert (report.type, report.describe()) == ("demo.report", "every day at 02:00 UTC")
    assert minute.cron == "* * * * *"
    assert ops.queues.limits.types == {"demo.charge-card": 2}
    app.extensions["jobdeck"].store.engine.dispose()


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
