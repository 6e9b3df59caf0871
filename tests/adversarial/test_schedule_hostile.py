"""Hostile runtime schedules: crontab strings that break parsers, huge and
deep payloads, NUL bytes in every field, odd and fake time zones, names with
slashes, unicode and markup. Each is a clear 422 (or 413) with a JSON
message, or a schedule that works; never a 500, never a stored entry that
stops a process from loading its schedules. Through the real app and the
real database (both, for what reaches the store)."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobdeck import create_app
from jobdeck.deck import Jobdeck

from tests.openapi_check import check

OK = {"cron": "*/5 * * * *", "type": "demo.noop"}


@pytest.fixture
def api(make_config, registry):
    deck = Jobdeck(make_config(), registry)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    yield deck, app.test_client()
    deck.store.engine.dispose()


def send(client: Any, body: Any) -> Any:
    return client.post("/api/schedules", data=json.dumps(body), content_type="application/json")


def refused(r: Any, status: int | tuple[int, ...] = 422) -> str:
    statuses = (status,) if isinstance(status, int) else status
    assert r.status_code in statuses, (r.status_code, r.get_data(as_text=True)[:300])
    assert r.mimetype == "application/json" and r.get_json()["error"]
    return str(r.get_json()["error"])


HOSTILE_CRONS = [
    "", " ", "* * * *", "* * * * * * *", "*/0 * * * *", "L * * * *", "0 0 1W * *", "0 0 * * 5L", "? * * * *",
    "1-99999999999999999999 * * * *", "59-0 * * * *", "*/1000000 * * * *", "0 0 0 * *", "0 0 * * 8", "0 0 * * -1",
    "0 0 31 2 *", "0 0 30 2 *", "0 0 * 13 *", "@daily", "@reboot", "%s%s%s%n * * * *", "${jndi:ldap://x} * * * *",
    "0\x00 * * * *", "٣ * * * *", "¹ * * * *", "* * * * * " * 40, "a" * 10_000, "0,0,0,0,0,0,0,0,0,0 " * 30,
    "0 0 * * 0-7/0", "0 0 * * 7-0",
]  # fmt: skip


@pytest.mark.parametrize("cron", HOSTILE_CRONS)
def test_hostile_crons_are_refused_with_the_reason(api, cron):
    deck, client = api
    started = time.monotonic()
    error = refused(send(client, {**OK, "name": "x", "cron": cron}))
    assert "cron" in error
    assert time.monotonic() - started < 5
    assert deck.schedules.all() == {}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cron=st.text(alphabet=st.sampled_from("0123456789*/,-LW#? abcdefghijklmnopqrstuvwxyz\x00"), max_size=40))
def test_fuzzed_crons_never_break_the_api(api, cron):
    deck, client = api
    r = send(client, {**OK, "name": "fuzz", "cron": cron})
    assert r.status_code in (201, 409, 422), r.get_data(as_text=True)[:300]
    if r.status_code == 201:
        assert deck.schedules.get("fuzz").next_fire(deck.clock()) is not None
        assert client.delete("/api/schedules/fuzz").status_code == 200
    assert client.get("/schedules").status_code == 200


@pytest.mark.parametrize(
    "tz", ["Mars/Olympus", "../../etc/passwd", "/etc/localtime", "", " UTC", "UTC\x00", "Europe/Paris/../Paris",
           "x" * 1000, 42, None, ["UTC"], "EST5EDT\n"],
)  # fmt: skip
def test_fake_time_zones_are_refused(api, tz):
    _, client = api
    assert "timezone" in refused(send(client, {**OK, "name": "tz", "timezone": tz}))


@pytest.mark.parametrize("tz", ["Pacific/Kiritimati", "Asia/Kathmandu", "America/St_Johns", "Etc/GMT-14",
                                "America/New_York", "Australia/Lord_Howe"])  # fmt: skip
def test_odd_but_real_time_zones_fire_at_their_local_time(api, tz):
    deck, client = api
    made = check(send(client, {"name": f"tz {tz}", "cron": "30 2 * * *", "type": "demo.noop", "timezone": tz}),
                 "/api/schedules", "post")  # fmt: skip
    assert made["timezone"] == tz and made["next_run"].endswith("Z")
    fire = deck.schedules.get(f"tz {tz}").next_fire(deck.clock())
    assert fire is not None


@pytest.mark.backends
@pytest.mark.parametrize("field", ["name", "cron", "timezone", "type", "queue", "expect_success_within"])
def test_nul_bytes_in_any_field_are_refused(api, field):
    deck, client = api
    body = {**OK, "name": "nul", "queue": "q", field: f"a\x00{field}"}
    refused(send(client, body))
    assert deck.schedules.all() == {}


@pytest.mark.backends
def test_nul_and_unicode_inside_the_payload_are_stored_and_sent_back(api):
    deck, client = api
    payload = {"text": "a\x00b", "emoji": "🚀", "rtl": "\u202eevil"}
    check(send(client, {**OK, "name": "nul-payload", "payload": payload}), "/api/schedules", "post")
    deck.schedules.refresh(force=True)
    assert deck.schedules.get("nul-payload").payload == payload
    job = deck.schedules.run_now("nul-payload", deck.clock(), "test")
    assert deck.store.get(job.id).payload == payload


def test_huge_and_deep_payloads_are_refused(api):
    deck, client = api
    limit = deck.config.max_payload_bytes
    refused(send(client, {**OK, "name": "big", "payload": {"blob": "x" * (limit + 1)}}), (413, 422))
    refused(send(client, {**OK, "name": "bigger", "payload": {"blob": "x" * (limit * 4)}}), 413)
    deep: Any = {}
    for _ in range(5000):
        deep = {"d": deep}
    r = client.post("/api/schedules", data='{"name": "deep", "cron": "* * * * *", "type": "demo.noop", "payload": '
                    + json.dumps({"d": 1}).replace("1", "[" * 3000 + "]" * 3000) + "}",
                    content_type="application/json")  # fmt: skip
    refused(r, (400, 422))
    refused(send(client, {**OK, "name": "list", "payload": ["not", "an", "object"]}))
    assert deck.schedules.all() == {}


NAMES = ["a/b/c", "..", "../etc", "with spaces", "日本語の予定", "rocket 🚀", "a?b#c&d=e", "%2F%00", "x/run",
         "<script>alert(1)</script>", "ends/", "/starts", "n" * 200]  # fmt: skip


@pytest.mark.backends
@pytest.mark.parametrize("name", NAMES)
def test_odd_names_round_trip_through_the_api_and_the_page(api, name):
    deck, client = api
    made = check(send(client, {**OK, "name": name}), "/api/schedules", "post")
    assert made["name"] == name
    path = "/api/schedules/" + quote(name, safe="")
    if not name.startswith("/") and not name.endswith("/") and ".." not in name:
        edited = check(client.put(path, json={**OK, "cron": "0 1 * * *"}), "/api/schedules/{name}", "put")
        assert edited["cron"] == "0 1 * * *"
    page = client.get("/schedules").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in page
    for stored in deck.schedules.all():
        assert stored == name
    assert deck.runtime_schedules.delete(name, "test", deck.clock()) is None


@pytest.mark.parametrize("name", ["", " ", "line\nbreak", "tab\there", "nul\x00", "x" * 201, "\u2028", 7, None,
                                  ["a"], "\ud800"])  # fmt: skip
def test_bad_names_are_refused(api, name):
    _, client = api
    body = json.dumps({**OK, "name": name})
    r = client.post("/api/schedules", data=body, content_type="application/json")
    assert "name" in refused(r) or "Unicode" in r.get_json()["error"]


def test_a_stored_entry_that_no_longer_parses_does_not_stop_the_others(api, registry):
    from jobdeck import demo
    from jobdeck.jobs.handlers import Registry

    deck, client = api

    @registry.handler("temp.kind")
    def temp(payload, ctx):
        return None

    check(send(client, {**OK, "name": "doomed", "type": "temp.kind"}), "/api/schedules", "post")
    check(send(client, {**OK, "name": "fine"}), "/api/schedules", "post")
    without = Registry()  # the next release dropped the handler
    demo.register(without)
    fresh = Jobdeck(deck.config, without)
    try:
        assert set(fresh.schedules.all()) == {"fine"} and "unknown job type" in fresh.schedules.invalid["doomed"]
        fresh.schedules.enqueue_due_once(fresh.clock())
        listed = {s["name"]: s for s in fresh.schedules.overview(fresh.clock())}
        assert listed["doomed"]["source"] == "runtime" and "unknown job type" in listed["doomed"]["description"]
        assert listed["fine"]["configured"] is True
    finally:
        fresh.store.engine.dispose()
