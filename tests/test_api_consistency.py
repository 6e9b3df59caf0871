"""The API answers alike wherever a client looks: an empty ``status`` on
``/api/errors`` is refused like any other value it does not take, and every
timestamp is ``iso``'s UTC with a ``Z`` (artifacts and schedules as jobs),
each response checked against the OpenAPI document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext
from jobdeck.store import Outcome
from jobdeck.web.serialize import iso

from tests.openapi_check import check

pytestmark = pytest.mark.backends

SCHEDULES = [{"name": "tick", "cron": "* * * * *", "type": "demo.noop"}]


def _client(deck: Jobdeck) -> Any:
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return app.test_client()


@pytest.mark.parametrize("query", ["status=", "status=&status=dead"])
def test_an_empty_status_is_422_and_an_absent_one_means_dead(make_deck, clock, query: str) -> None:
    client = _client(make_deck(clock))
    r = client.get(f"/api/errors?{query}")
    body = check(r, "/api/errors", "get")
    assert r.status_code == 422 and body["field"] == "status"
    assert "one of failed, dead" in body["error"]
    assert check(client.get("/api/errors"), "/api/errors", "get")["status"] == "dead"


def test_artifact_and_schedule_times_are_utc_with_a_z_like_job_times(make_deck, clock, registry) -> None:
    deck = make_deck(clock, schedules=SCHEDULES)
    client = _client(deck)
    job, _ = deck.enqueue("demo.noop", {})
    (claimed,) = deck.store.claim("w1", clock.now, limit=1, types=["demo.noop"])
    JobContext(deck.store, job.id, claimed.attempt, "w1", job.type, deck.clock).artifact("a.csv", "x")
    deck.store.complete_many([Outcome(job.id, "w1", attempt=claimed.attempt)], clock.now)
    deck.schedules.run_now("tick", clock.now, "test")

    [artifact] = check(client.get(f"/api/jobs/{job.id}/artifacts"), "/api/jobs/{job_id}/artifacts", "get")["artifacts"]
    assert artifact["created_at"] == iso(clock.now) == "2026-01-01T12:00:00Z"
    [tick] = check(client.get("/api/schedules"), "/api/schedules", "get")["schedules"]
    assert tick["next_run"] == "2026-01-01T12:01:00Z"
    assert tick["runs"][0]["fire_time"] == "2026-01-01T12:00:00Z"
    job_created = check(client.get(f"/api/jobs/{job.id}"), "/api/jobs/{job_id}", "get")["created_at"]
    assert job_created.endswith("Z") and datetime.fromisoformat(job_created) == clock.now


def test_iso_writes_any_aware_time_in_utc() -> None:
    moment = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert iso(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-01-01T12:00:00Z"
    assert iso(moment.replace(microsecond=5)) == "2026-01-01T12:00:00.000005Z"
    assert iso(None) is None
