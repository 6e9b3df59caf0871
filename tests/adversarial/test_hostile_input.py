"""Hostile input to the JSON API and the dashboard: each of these was a 500
(or, for NaN, a stored value sent back as invalid JSON). Now each is a clear
4xx with a JSON message (the API) or a visible message (the dashboard).

Real app, real database file. The tests whose input would reach the store
run on SQLite and on PostgreSQL (marked ``backends``), where a NUL in text is
a DataError and an id past BIGINT another one; the rest are refused before
any SQL and run on SQLite."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dashboard_support import HTMX, csrf_token, make_dead
from dashboard_support import post as dash_post
from jobdeck import create_app
from jobdeck.core.validation import INT64_MAX, MAX_JSON_DEPTH

JOBS = "/api/jobs"
BEYOND = [str(2**63), str(2**64), "9" * 40]
"""Integers one past BIGINT, past unsigned BIGINT, and far past."""
FOREIGN_DIGITS = ["²", "١", "¹²", "٣"]
"""``str.isdigit`` is true for all of them; ``int()`` refuses the superscripts."""


def send(client: Any, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def refused(response: Any, status: int | tuple[int, ...] = 422, field: str | None = None) -> dict[str, Any]:
    """Assert a clear refusal: the status, a JSON body with a message, and
    the field it names."""
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.get_data(as_text=True)[:500])
    assert response.mimetype == "application/json"
    data = response.get_json()
    assert isinstance(data["error"], str) and data["error"]
    if field is not None:
        assert data.get("field") == field, data
    return data


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def claimed(client: Any, **job: Any) -> int:
    """A job enqueued and claimed by worker ``w`` over the API."""
    job_id = send(client, JOBS, {"type": "demo.noop", **job}).get_json()["id"]
    got = send(client, f"{JOBS}/claim", {"worker_id": "w", "limit": 10}).get_json()
    assert job_id in [j["id"] for j in got]
    return int(job_id)


# -- integers ------------------------------------------------------------------------


@pytest.mark.backends
def test_ids_beyond_int64_are_404(client) -> None:
    for number in BEYOND:
        refused(client.get(f"{JOBS}/{number}"), 404)
        for action in ("heartbeat", "complete", "fail", "retry", "discard"):
            refused(send(client, f"{JOBS}/{number}/{action}", {"worker_id": "w", "error": "e"}), 404)
    # The largest id is a real question with the answer "no such job".
    assert "does not exist" in refused(client.get(f"{JOBS}/{INT64_MAX}"), 404)["error"]


@pytest.mark.backends
def test_cursor_beyond_int64_or_in_foreign_digits_is_422(client) -> None:
    for number in BEYOND + FOREIGN_DIGITS:
        refused(client.get(JOBS, query_string={"cursor": number}), 422, "cursor")
        refused(client.get(JOBS, query_string={"limit": number}), 422, "limit")
    assert client.get(JOBS, query_string={"cursor": str(INT64_MAX)}).status_code == 200


@pytest.mark.backends
def test_foreign_digits_in_priority_are_422_and_in_q_are_text(client) -> None:
    for digits in FOREIGN_DIGITS:
        refused(send(client, JOBS, {"type": "demo.noop", "priority": digits}), 422, "priority")
        refused(send(client, JOBS, {"type": "demo.noop", "priority": "-" + digits}), 422, "priority")
        job = send(client, JOBS, {"type": "demo.noop", "payload": {"note": f"x{digits}y"}}).get_json()
        found = client.get(JOBS, query_string={"q": digits})
        assert found.status_code == 200 and job["id"] in [j["id"] for j in found.get_json()["jobs"]], digits
        assert client.get(JOBS, query_string={"q": "#" + digits}).status_code == 200, digits
    assert client.get(JOBS, query_string={"q": "9" * 30}).get_json()["jobs"] == []


def test_priority_strings_in_ascii_digits_still_work(client) -> None:
    assert send(client, JOBS, {"type": "demo.noop", "priority": "-25"}).get_json()["priority"] == -25
    assert send(client, JOBS, {"type": "demo.noop", "priority": "HIGH"}).get_json()["priority"] == 20
    refused(send(client, JOBS, {"type": "demo.noop", "priority": "1000001"}), 422, "priority")


# -- numbers that are not numbers, times that are not times ----------------------------


@pytest.mark.parametrize("literal", ["NaN", "-Infinity", "1e999"])
def test_non_finite_numbers_anywhere_are_refused_and_nothing_is_stored(client, deck, literal) -> None:
    bodies = {
        "delay_seconds": f'{{"type": "demo.noop", "delay_seconds": {literal}}}',
        "payload.price": f'{{"type": "demo.noop", "payload": {{"price": {literal}}}}}',
        "payload.items[1].n": f'{{"type": "demo.noop", "payload": {{"items": [1, {{"n": {literal}}}]}}}}',
        "priority": f'{{"type": "demo.noop", "priority": {literal}}}',
    }
    for field, body in bodies.items():
        r = client.post(JOBS, data=body, content_type="application/json")
        assert "finite" in refused(r, 422, field)["error"]
    job_id = claimed(client)
    r = client.post(f"{JOBS}/{job_id}/complete", data=f'{{"worker_id": "w", "result": {{"x": {literal}}}}}',
                    content_type="application/json")  # fmt: skip
    refused(r, 422, "result.x")
    assert deck.store.get(job_id).status.value == "running"
    assert deck.store.counts(deck.clock())["pending"] == 0
    with pytest.raises(Exception, match="finite"):
        deck.enqueue("demo.noop", {"x": float(literal)})  # Python callers too


@pytest.mark.parametrize("run_at", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_run_at_that_overflows_in_utc_is_422(client, run_at) -> None:
    assert "outside" in refused(send(client, JOBS, {"type": "demo.noop", "run_at": run_at}), 422, "run_at")["error"]


@pytest.mark.backends
def test_run_at_at_the_edges_of_the_calendar_is_kept(client) -> None:
    for run_at in ("9999-12-31T23:59:59+00:00", "0001-01-01T05:00:00+05:00"):
        job = send(client, JOBS, {"type": "demo.noop", "run_at": run_at}).get_json()
        again = client.get(f"{JOBS}/{job['id']}").get_json()
        assert again["available_at"] == job["available_at"]


# -- shapes and sizes ----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 10_000])
def test_deeply_nested_json_is_refused_not_a_recursion_error(client, depth) -> None:
    deep = nested(depth)
    refused(client.post(JOBS, data=f'{{"type": "demo.noop", "payload": {{"a": {deep}}}}}',
                        content_type="application/json"), (400, 422))  # fmt: skip
    refused(client.post(JOBS, data=deep, content_type="application/json"), (400, 422))
    job_id = claimed(client)
    refused(client.post(f"{JOBS}/{job_id}/complete", data=f'{{"worker_id": "w", "result": {deep}}}',
                        content_type="application/json"), (400, 422))  # fmt: skip


def test_nesting_up_to_the_limit_is_accepted(client) -> None:
    # The body is level 1, the payload level 2, its value "a" level 3.
    job = send(client, JOBS, {"type": "demo.noop", "payload": {"a": json.loads(nested(MAX_JSON_DEPTH - 2))}})
    assert job.status_code == 201, job.get_json()
    one_more = send(client, JOBS, {"type": "demo.noop", "payload": {"a": json.loads(nested(MAX_JSON_DEPTH - 1))}})
    assert "deeper than 64" in refused(one_more, 422)["error"]


def test_a_long_search_is_422(client) -> None:
    for length in (201, 50_001, 200_000):
        refused(client.get(JOBS, query_string={"q": "x" * length}), 422, "q")
    assert client.get(JOBS, query_string={"q": "x" * 200}).status_code == 200


@pytest.mark.backends
def test_lone_surrogates_are_refused(client) -> None:
    for field, body in {
        "queue": '{"type": "demo.noop", "queue": "\\ud800"}',
        "payload.k": '{"type": "demo.noop", "payload": {"k": "a\\udfffb"}}',
        "idempotency_key": '{"type": "demo.noop", "idempotency_key": "\\ud83d"}',
    }.items():
        refused(client.post(JOBS, data=body, content_type="application/json"), 422, field)


# -- NUL ---------------------------------------------------------------------------------------


@pytest.mark.backends
def test_nul_in_enqueue_text_is_422(client, deck) -> None:
    for field in ("queue", "idempotency_key", "type"):
        refused(send(client, JOBS, {"type": "demo.noop", field: "a\x00b"}), 422, field)
    assert deck.store.counts(deck.clock())["pending"] == 0


@pytest.mark.backends
def test_nul_in_a_payload_is_stored_as_json_escape(client) -> None:
    job = send(client, JOBS, {"type": "demo.noop", "payload": {"s": "a\x00b"}})
    assert job.status_code == 201
    assert client.get(f"{JOBS}/{job.get_json()['id']}").get_json()["payload"] == {"s": "a\x00b"}


@pytest.mark.backends
def test_nul_in_list_filters_is_422(client) -> None:
    for arg in ("q", "type", "queue"):
        refused(client.get(JOBS, query_string={arg: "a\x00b"}), 422, arg)


@pytest.mark.backends
def test_nul_in_the_worker_protocol_is_422_and_the_job_stays_held(client, deck) -> None:
    job_id = claimed(client)
    refused(send(client, f"{JOBS}/{job_id}/fail", {"worker_id": "w", "error": "broke\x00here"}), 422, "error")
    refused(send(client, f"{JOBS}/{job_id}/fail", {"worker_id": "w", "error": "e", "traceback": "\x00"}), 422,
            "traceback")  # fmt: skip
    refused(send(client, f"{JOBS}/{job_id}/heartbeat", {"worker_id": "w\x00"}), 422, "worker_id")
    refused(send(client, f"{JOBS}/claim", {"worker_id": "w", "types": ["demo.noop\x00"]}), 422, "types")
    refused(send(client, f"{JOBS}/claim", {"worker_id": "w", "queues": []}), 422, "queues")
    assert deck.store.get(job_id).status.value == "running"
    failed = send(client, f"{JOBS}/{job_id}/fail", {"worker_id": "w", "error": "broke here"})
    assert failed.status_code == 200 and failed.get_json()["error"] == "broke here"


@pytest.mark.backends
def test_nul_in_a_queue_name_is_422(client) -> None:
    refused(client.post("/api/queues/a%00b/pause"), 422, "name")


# -- bodies: size and media type -----------------------------------------------------------------


def test_payload_under_the_limit_passes_however_it_is_escaped(client, deck) -> None:
    payload = {"text": "€" * 20000}  # 60,000 bytes as UTF-8 JSON, 120,000 ASCII-escaped
    assert deck.config.max_payload_bytes == 65536
    body = json.dumps({"type": "demo.noop", "payload": payload})  # ensure_ascii: every € is \u20ac
    assert len(body) > 2 * 60000
    r = client.post(JOBS, data=body, content_type="application/json")
    assert r.status_code == 201, r.get_json()
    assert client.get(f"{JOBS}/{r.get_json()['id']}").get_json()["payload"] == payload


def test_payload_over_the_limit_is_413_naming_its_size(client) -> None:
    r = send(client, JOBS, {"type": "demo.noop", "payload": {"text": "€" * 22000}})
    assert "66011 bytes; the limit is 65536" in refused(r, 413)["error"]


def test_raw_body_past_its_cap_is_413(client) -> None:
    r = client.post(JOBS, data=json.dumps({"type": "demo.noop", "pad": " " * 300_000}), content_type="application/json")
    assert refused(r, 413)["error"].startswith("request body too large: at most ")


POSTS = [
    f"{JOBS}", f"{JOBS}/claim", f"{JOBS}/1/heartbeat", f"{JOBS}/1/complete", f"{JOBS}/1/fail", f"{JOBS}/1/retry",
    f"{JOBS}/1/discard", "/api/queues/default/pause", "/api/queues/default/resume",
    "/api/schedules/x/run", "/api/schedules/x/pause", "/api/schedules/x/resume",
]  # fmt: skip


def test_every_api_body_must_be_json(client, deck) -> None:
    """What a cross-site form or a no-cors fetch can send is refused before
    anything happens: no job enqueued, no queue paused."""
    body = json.dumps({"type": "demo.noop", "worker_id": "w"})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
        for url in POSTS:
            r = client.post(url, data=body, headers={"Content-Type": content_type} if content_type else {})
            assert "application/json" in refused(r, 415)["error"], (url, content_type)
    assert deck.store.counts(deck.clock())["pending"] == 0
    assert client.get("/api/queues").get_json()["queues"][0]["paused"] is False


def test_json_bodies_with_parameters_and_empty_bodies_still_work(client) -> None:
    r = client.post(JOBS, data=json.dumps({"type": "demo.noop"}), content_type="application/json; charset=utf-8")
    assert r.status_code == 201
    assert client.post(f"{JOBS}/{r.get_json()['id']}/discard").status_code == 200  # no body, no type needed
    assert client.post("/api/queues/default/pause").status_code == 200


def test_the_document_lists_every_refusal_it_can_answer(client) -> None:
    doc = client.get("/api/openapi.json").get_json()
    enqueue = doc["paths"]["/api/jobs"]["post"]
    assert {"400", "401", "409", "413", "415", "422"} <= set(enqueue["responses"])
    new_job = doc["components"]["schemas"]["NewJob"]["properties"]
    assert new_job["type"]["examples"] == sorted(client.application.extensions["jobdeck"].registry.names())
    assert new_job["max_retries"] == {"type": "integer", "minimum": 0, "maximum": 1000}
    assert new_job["queue"]["maxLength"] == 100 and new_job["delay_seconds"]["maximum"] == 10 * 365 * 86400
    schemas = doc["components"]["schemas"]
    ints, labels, numeric = schemas["Priority"]["anyOf"]
    assert (ints["minimum"], ints["maximum"]) == (-1_000_000, 1_000_000)
    assert labels == {"$ref": "#/components/schemas/PriorityLabel"}
    assert schemas["PriorityLabel"]["enum"] == ["low", "medium", "high", "critical"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method == "post":
                assert "415" in op["responses"], path


# -- the dashboard ------------------------------------------------------------------------------


HOSTILE_LIST_ARGS = [
    {"before": "²"}, {"before": str(2**63)}, {"after": "١"}, {"after": "9" * 40},
    {"q": "a\x00b"}, {"type": "\x00"}, {"queue": "q\x00"}, {"q": "x" * 50_001},
]  # fmt: skip


@pytest.mark.backends
def test_dashboard_lists_show_a_message_for_hostile_filters(dash) -> None:
    token = csrf_token(dash)
    for args in HOSTILE_LIST_ARGS:
        page = dash.get("/jobs/dead", query_string=args)
        assert page.status_code == 422 and page.mimetype == "text/html", args
        text = page.get_data(as_text=True)
        assert "must" in text or "at most" in text, args
        fragment = dash.get("/fragments/jobs/dead/rows", query_string=args, headers=HTMX)
        assert fragment.status_code == 422 and 'class="flash' in fragment.get_data(as_text=True), args
        confirm = dash.get("/jobs/dead/confirm/retry", query_string=args, headers=HTMX)
        assert confirm.status_code == 422, args
        matching = dash.post("/actions/matching/retry", data={"tab": "dead", **args},
                             headers={**HTMX, "X-CSRFToken": token})  # fmt: skip
        assert matching.status_code == 422, args


@pytest.mark.backends
def test_dashboard_search_in_foreign_digits_is_a_search(dash, deck) -> None:
    job_id = make_dead(deck, payload={"note": "²"})
    page = dash.get("/jobs/dead", query_string={"q": "²"})
    assert page.status_code == 200 and f"/jobs/{job_id}" in page.get_data(as_text=True)


@pytest.mark.backends
def test_dashboard_ids_beyond_int64_are_404_or_422(dash) -> None:
    for number in BEYOND:
        assert dash.get(f"/jobs/{number}").status_code == 404
        assert dash.get(f"/fragments/jobs/{number}", headers=HTMX).status_code == 404
        assert dash_post(dash, f"/actions/jobs/{number}/retry").status_code == 404
        assert dash.get("/audit", query_string={"before": number}).status_code == 422
        selected = dash_post(dash, "/actions/selected/retry", {"tab": "dead", "ids": [number]})
        assert selected.status_code == 422 and "ids" in selected.get_data(as_text=True)
        bulk = dash_post(dash, "/actions/matching/retry", {"tab": "dead", "up_to": number, "below": number})
        assert bulk.status_code == 422 and "up_to" in bulk.get_data(as_text=True)


def test_dashboard_audit_and_selection_refuse_foreign_digits(dash) -> None:
    assert dash.get("/audit", query_string={"before": "²"}).status_code == 422
    assert dash_post(dash, "/actions/selected/retry", {"tab": "dead", "ids": ["²"]}).status_code == 422


def test_edit_and_retry_refuses_unacceptable_json_with_a_message(dash, deck) -> None:
    job_id = make_dead(deck)
    for text in ('{"x": NaN}', '{"x": [Infinity]}', '{"k": "\\ud800"}', '{"a": ' + nested(1000) + "}", nested(10_000)):
        r = dash_post(dash, f"/actions/jobs/{job_id}/edit", {"payload": text})
        assert r.status_code == 422, text[:20]
        assert "Not an acceptable payload" in r.get_data(as_text=True), text[:20]
    assert deck.store.get(job_id).status.value == "dead" and deck.store.get(job_id).payload == {}


def test_integers_too_long_to_convert_are_422_everywhere(client, dash, deck, runner_env) -> None:
    """Python refuses to convert integers past 4,300 digits with a bare ValueError: the edit form
    answered 500 and the CLI printed a traceback."""
    huge = "9" * 5000
    r = client.post(JOBS, data='{"type": "demo.noop", "payload": {"a": ' + huge + "}}", content_type="application/json")
    assert r.status_code == 422 and "digits" in r.get_json()["error"]
    assert send(client, JOBS, {"type": "demo.noop", "payload": {"a": int("9" * 100)}}).status_code == 201
    job_id = make_dead(deck)
    edit = dash_post(dash, f"/actions/jobs/{job_id}/edit", {"payload": '{"a": ' + huge + "}"})
    assert edit.status_code == 422 and "Not an acceptable payload" in edit.get_data(as_text=True)
    result = runner_env.invoke(["enqueue", "demo.noop", "--payload", '{"a": ' + huge + "}", "--demo"])
    assert result.exit_code == 2 and "digits" in result.output and "Traceback" not in result.output


@pytest.fixture
def runner_env(tmp_path, monkeypatch) -> Any:
    """The CLI on its own SQLite file."""
    from click.testing import CliRunner
    from jobdeck.cli import main

    monkeypatch.setenv("JOBDECK_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("JOBDECK_INSTANCE_PATH", str(tmp_path / "instance"))

    class Runner:
        def invoke(self, args: list[str]) -> Any:
            return CliRunner().invoke(main, args)

    return Runner()


def test_edit_and_retry_takes_a_payload_under_the_limit(dash, deck) -> None:
    job_id = make_dead(deck)
    r = dash_post(dash, f"/actions/jobs/{job_id}/edit", {"payload": json.dumps({"text": "€" * 20000})})
    assert r.status_code == 200
    assert deck.store.get(job_id).payload == {"text": "€" * 20000}


@pytest.mark.backends
def test_dashboard_queue_names_with_nul_are_refused(dash) -> None:
    r = dash.post("/queues/a%00b/pause", headers={**HTMX, "X-CSRFToken": csrf_token(dash)})
    assert r.status_code == 422 and "NUL" in r.get_data(as_text=True)


def test_refusals_in_html_are_escaped(make_deck, clock) -> None:
    deck = make_deck(clock)
    dash = create_app(deck=deck).test_client()
    page = dash.get("/jobs/dead", query_string={"before": "<script>1</script>"})
    assert page.status_code == 422 and "<script>1" not in page.get_data(as_text=True)


def test_a_job_error_cannot_forge_a_log_line() -> None:
    """A handler's error text is user data; the server log keeps each record on one line."""
    import logging

    from jobdeck.cli import OneLineFormatter

    formatter = OneLineFormatter("%(levelname)s %(name)s: %(message)s")
    forged = "boom\n2026-12-01 11:20:00,000 INFO jobdeck.worker: FORGED\r\x1b[2K\x00"
    record = logging.LogRecord("jobdeck.worker", logging.ERROR, __file__, 1, "job %s is dead: %s", (7, forged), None)
    line = formatter.format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x00" not in line
    assert line.startswith("ERROR jobdeck.worker: job 7 is dead: boom\\n2026-12-01") and "FORGED" in line
    try:
        raise ValueError("x")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "Traceback (most recent call last):\n" in formatter.format(record)  # tracebacks keep their lines
