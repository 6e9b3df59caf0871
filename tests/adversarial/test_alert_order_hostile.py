"""Hostile alert job payloads meet the superseded check (an operator may edit
a queued job's payload): wrong types, NUL bytes, huge and deep values, naive
and garbled times. The check never raises (a raise would retry the job until
it is dead); a payload it cannot read is sent as before. On both databases."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_alerts import free_port

pytestmark = pytest.mark.backends

DEEP: Any = {}
for _ in range(200):
    DEEP = {"a": DEEP}

HOSTILE: list[Any] = [
    None, 5, "x", [], DEEP, "\x00", "a\x00b", "x" * 100_000, "2026-01-01T12:00:00", "2026-13-45T99:99:99+00:00",
    "2026-01-01T12:00:00+00:00\x00", {"$gt": ""}, 1e308, True,
]  # fmt: skip


@pytest.fixture
def deck(make_deck, clock):
    port = free_port()
    hourly = {"name": "hourly", "cron": "0 * * * *", "type": "demo.noop", "expect_success_within": "90m"}
    alerts = {"webhook_url": f"http://127.0.0.1:{port}/hook", "thresholds": {"queue_latency": 5}}
    d = make_deck(clock, schedules=[hourly], alerts=alerts)
    d.schedule_health.check_once(clock.now)
    d.schedule_health.check_once(clock.advance(91 * 60))  # a real row, unhealthy, to compare with
    d.enqueue("demo.noop", queue="mail")
    d.thresholds.check_once(clock.advance(6))
    return d


def test_a_hostile_threshold_message_is_judged_without_raising(deck, clock):
    body = {"event": "threshold.firing", "alert": "queue_latency", "queue": "mail", "at": clock.now.isoformat()}
    for field in ("alert", "queue", "type", "at", "event"):
        for value in HOSTILE:
            result = deck.thresholds.superseded({**body, field: value})
            assert result is None or result.startswith("superseded by "), (field, value)


def test_a_hostile_schedule_health_message_is_judged_without_raising(deck, clock):
    base: dict[str, Any] = {"body": {"event": "schedule.unhealthy", "schedule": "hourly"},
                            "episode": "2026-01-01T12:00:00+00:00"}  # fmt: skip
    for field in ("schedule", "event", "episode", "body"):
        for value in HOSTILE:
            payload = dict(base)
            if field in ("schedule", "event"):
                payload["body"] = {**base["body"], field: value}
            else:
                payload[field] = value
            result = deck.schedule_health.superseded(payload)
            assert result is None or result.startswith("superseded by "), (field, value)


def test_the_real_rows_are_current_for_their_own_messages(deck, clock):
    """The fixture's rows, as a check: the hostile cases above ran against live state."""
    from jobdeck.maintenance.alerts import ALERT_TYPE
    from jobdeck.maintenance.thresholds import THRESHOLD_TYPE
    from jobdeck.store import JobFilter

    for job_type, judge in (
        (THRESHOLD_TYPE, deck.thresholds.superseded),
        (ALERT_TYPE, deck.schedule_health.superseded),
    ):
        jobs = deck.store.list_jobs(JobFilter(type=job_type, limit=10), clock.now)
        assert jobs and all(judge(j.payload) is None for j in jobs if j.payload.get("queue", "mail") == "mail")
