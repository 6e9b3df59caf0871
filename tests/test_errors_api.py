"""``GET /api/errors``: the token, the status it takes, and what it says,
each response checked against the OpenAPI document."""

from __future__ import annotations

import pytest
from jobdeck import create_app
from test_error_groups import fail_jobs

from tests.openapi_check import check

pytestmark = pytest.mark.backends

URL = "/api/errors"


def test_groups_largest_first_with_counts_times_and_sample(client, deck, clock):
    fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'"])
    clock.advance(30)
    [card] = fail_jobs(deck, "demo.fail", ["RuntimeError: card 4242 declined"])
    [retrying] = fail_jobs(deck, "demo.fail", ["OSError: disk 3 full"], retryable=True)

    dead = check(client.get(URL), URL, "get")
    assert dead["status"] == "dead"
    assert [(g["fingerprint"], g["count"]) for g in dead["groups"]] == [
        ("KeyError: '?'", 2),
        ("RuntimeError: card ? declined", 1),
    ]
    assert dead["groups"][1]["sample"] == {"id": card, "error": "RuntimeError: card 4242 declined"}
    assert dead["groups"][0]["first_seen"] == "2026-01-01T12:00:00Z"
    assert dead["groups"][1]["last_seen"] == "2026-01-01T12:00:30Z"

    failed = check(client.get(URL, query_string={"status": "failed"}), URL, "get")
    assert [(g["type"], g["sample"]["id"]) for g in failed["groups"]] == [("demo.fail", retrying)]


@pytest.mark.parametrize("status", ["pending", "completed", "DEAD", "nope", "x" * 5000, "dead\x00"])
def test_a_status_that_is_not_failed_or_dead_is_422(client, status):
    r = client.get(URL, query_string={"status": status})
    body = check(r, URL, "get")
    assert r.status_code == 422 and body["field"] == "status"
    assert "one of failed, dead" in body["error"] and len(body["error"]) < 200


def test_the_token_is_required_like_every_api_route(make_deck, clock):
    deck = make_deck(clock, api_token="s3cret")
    fail_jobs(deck, "demo.fail", ["KeyError: 'a'"])
    client = create_app(deck=deck).test_client()
    assert check(client.get(URL), URL, "get")["error"] == "missing or invalid bearer token"
    assert client.get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = client.get(URL, headers={"Authorization": "Bearer s3cret"})
    assert check(ok, URL, "get")["groups"][0]["count"] == 1


def test_hostile_messages_come_back_as_json_data_never_markup(client, deck):
    hostile = 'RuntimeError: <script>alert(1)</script> "q" \x00 \u202e 🎉'
    fail_jobs(deck, "demo.fail", [hostile])
    r = client.get(URL)
    assert r.mimetype == "application/json" and r.headers["X-Content-Type-Options"] == "nosniff"
    [group] = check(r, URL, "get")["groups"]
    assert group["sample"]["error"] == hostile.replace("\x00", "\\x00")
    assert group["fingerprint"] == 'RuntimeError: <script>alert(?)</script> "?" \\x? \u202e 🎉'
