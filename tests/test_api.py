"""Every API endpoint and every error case, each response checked against
the OpenAPI document."""

from __future__ import annotations

import http.client
import json
import threading
from datetime import timedelta

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck

from tests.openapi_check import check

JOBS = "/api/jobs"


def post(client, path: str, body=None, **kw):
    return client.post(path, json=body, **kw) if body is not None else client.post(path, **kw)


def test_enqueue_created_with_labels_and_times(client, clock) -> None:
    r = post(client, JOBS, {"type": "demo.noop", "payload": {"x": "<b>"}, "priority": "high", "delay_seconds": 30})
    job = check(r, "/api/jobs", "post")
    assert r.status_code == 201
    assert job["priority"] == 20 and job["priority_label"] == "high"
    assert job["status"] == "pending" and job["scheduled"] is True
    assert job["available_at"] == (clock() + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    r = post(client, JOBS, {"type": "demo.noop", "run_at": "2030-01-01T00:00:00Z", "priority": 15})
    assert check(r, "/api/jobs", "post")["available_at"] == "2030-01-01T00:00:00Z"
    assert r.get_json()["priority_label"] == "medium"


def test_repeated_key_returns_existing_with_200_and_conflict_409(client) -> None:
    body = {"type": "demo.noop", "payload": {"a": 1}, "idempotency_key": "order-7"}
    first = post(client, JOBS, body)
    again = post(client, JOBS, body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert check(again, "/api/jobs", "post")["id"] == first.get_json()["id"]
    conflict = post(client, JOBS, {**body, "payload": {"a": 2}})
    assert conflict.status_code == 409
    assert "different payload" in check(conflict, "/api/jobs", "post")["error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "demo.noop", "priority": "urgent"}, "priority"),
        ({"type": "demo.noop", "priority": True}, "priority"),
        ({"type": "demo.noop", "max_retries": -1}, "max_retries"),
        ({"type": "demo.noop", "payload": [1, 2]}, "payload"),
        ({"type": "demo.noop", "payload": "text"}, "payload"),
        ({"type": "demo.nope"}, "type"),
        ({"payload": {}}, "type"),
        ({"type": "demo.noop", "colour": "red"}, "colour"),
        ({"type": "demo.noop", "run_at": "yesterday"}, "run_at"),
        ({"type": "demo.noop", "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 1}, "run_at"),
        ({"type": "demo.noop", "delay_seconds": -5}, "delay_seconds"),
        ({"type": "demo.noop", "idempotency_key": ""}, "idempotency_key"),
        ({"type": "demo.noop", "queue": 7}, "queue"),
    ],
)
def test_enqueue_invalid_fields_are_422_naming_the_field(client, body, field) -> None:
    r = post(client, JOBS, body)
    assert r.status_code == 422
    error = check(r, "/api/jobs", "post")
    assert error["field"] == field and error["error"].startswith(f"{field}:")


def test_unknown_type_names_the_type(client) -> None:
    error = post(client, JOBS, {"type": "demo.nope"}).get_json()
    assert "'demo.nope'" in error["error"] and "external_types" in error["error"]


def test_malformed_json_is_400(client) -> None:
    r = client.post(JOBS, data="{not json", content_type="application/json")
    assert r.status_code == 400
    assert check(r, "/api/jobs", "post") == {"error": "malformed JSON in request body"}
    assert client.post(JOBS, data="[1]", content_type="application/json").status_code == 422


def test_payload_over_the_limit_is_413(make_deck, clock) -> None:
    deck = make_deck(clock, max_payload_bytes=1024)
    client = create_app(deck=deck).test_client()
    r = post(client, JOBS, {"type": "demo.noop", "payload": {"blob": "x" * 2000}})
    assert r.status_code == 413
    assert "limit is 1024 bytes" in check(r, "/api/jobs", "post")["error"]
    # The raw body has its own, larger cap (3 x 1024 + 64 KiB here).
    huge = client.post(JOBS, data=json.dumps({"type": "demo.noop", "payload": {"b": "x" * 80000}}),
                       content_type="application/json")  # fmt: skip
    assert huge.status_code == 413 and huge.get_json()["error"].startswith("request body too large: at most ")


def test_external_worker_protocol(client) -> None:
    assert check(post(client, "/api/jobs/claim", {"worker_id": "ext"}), "/api/jobs/claim", "post") is None
    ids = [post(client, JOBS, {"type": "demo.fail", "max_retries": 1}).get_json()["id"] for _ in range(3)]
    one = check(post(client, "/api/jobs/claim", {"worker_id": "ext"}), "/api/jobs/claim", "post")
    assert one["id"] == ids[0] and one["status"] == "running" and one["worker_id"] == "ext"
    batch = check(post(client, "/api/jobs/claim", {"worker_id": "ext", "limit": 5}), "/api/jobs/claim", "post")
    assert [j["id"] for j in batch] == ids[1:]

    beat = post(client, f"{JOBS}/{ids[0]}/heartbeat", {"worker_id": "ext"})
    assert check(beat, "/api/jobs/{job_id}/heartbeat", "post")["status"] == "running"

    failed = post(client, f"{JOBS}/{ids[0]}/fail", {"worker_id": "ext", "error": "pdf broke", "traceback": "tb"})
    job = check(failed, "/api/jobs/{job_id}/fail", "post")
    assert job["status"] == "failed" and job["retry_count"] == 1 and job["error"] == "pdf broke"
    assert job["available_at"] > job["updated_at"]

    final = post(client, f"{JOBS}/{ids[1]}/fail", {"worker_id": "ext", "error": "bad", "retryable": False})
    assert check(final, "/api/jobs/{job_id}/fail", "post")["status"] == "dead"

    done = post(client, f"{JOBS}/{ids[2]}/complete", {"worker_id": "ext", "result": {"pages": 3}})
    job = check(done, "/api/jobs/{job_id}/complete", "post")
    assert job["status"] == "completed" and job["result"] == {"pages": 3}

    shown = check(client.get(f"{JOBS}/{ids[0]}"), "/api/jobs/{job_id}", "get")
    assert [(a["attempt"], a["outcome"], a["error"], a["traceback"]) for a in shown["attempts"]] == [
        (1, "failed", "pdf broke", "tb")
    ]


def test_claim_filters_and_validation(client) -> None:
    post(client, JOBS, {"type": "demo.noop", "queue": "a"})
    sleeper = post(client, JOBS, {"type": "demo.sleep", "queue": "b"}).get_json()
    got = post(client, "/api/jobs/claim", {"worker_id": "x", "types": ["demo.sleep"], "limit": 10}).get_json()
    assert [j["id"] for j in got] == [sleeper["id"]]
    assert post(client, "/api/jobs/claim", {"worker_id": "x", "queues": ["zzz"]}).get_json() is None
    for bad, field in (({}, "worker_id"), ({"worker_id": "x", "limit": 0}, "limit"),
                       ({"worker_id": "x", "limit": 101}, "limit"), ({"worker_id": "x", "types": "a"}, "types")):  # fmt: skip
        r = post(client, "/api/jobs/claim", bad)
        assert r.status_code == 422 and check(r, "/api/jobs/claim", "post")["field"] == field


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail"])
def test_worker_calls_refused(client, action) -> None:
    body = {"worker_id": "ext", "error": "x"}
    path = f"/api/jobs/{{job_id}}/{action}"
    missing = post(client, f"{JOBS}/999/{action}", body)
    assert missing.status_code == 404 and check(missing, path, "post")["error"] == "job 999 does not exist"
    job = post(client, JOBS, {"type": "demo.noop"}).get_json()
    not_running = post(client, f"{JOBS}/{job['id']}/{action}", body)
    assert not_running.status_code == 409
    assert check(not_running, path, "post")["error"].startswith(f"job {job['id']} is pending; only running jobs")
    post(client, "/api/jobs/claim", {"worker_id": "owner"})
    other = post(client, f"{JOBS}/{job['id']}/{action}", body)
    assert other.status_code == 409 and "held by worker 'owner'" in check(other, path, "post")["error"]
    assert post(client, f"{JOBS}/{job['id']}/{action}", {}).status_code == 422


def test_fail_requires_an_error(client) -> None:
    job = post(client, JOBS, {"type": "demo.noop"}).get_json()
    post(client, "/api/jobs/claim", {"worker_id": "w"})
    r = post(client, f"{JOBS}/{job['id']}/fail", {"worker_id": "w"})
    assert r.status_code == 422 and r.get_json()["field"] == "error"
    r = post(client, f"{JOBS}/{job['id']}/fail", {"worker_id": "w", "error": "e", "retryable": "no"})
    assert r.status_code == 422 and r.get_json()["field"] == "retryable"


def test_retry_and_discard(client) -> None:
    job = post(client, JOBS, {"type": "demo.fail", "max_retries": 0}).get_json()
    refused = post(client, f"{JOBS}/{job['id']}/retry")
    assert refused.status_code == 409
    assert check(refused, "/api/jobs/{job_id}/retry", "post")["error"] == (
        f"job {job['id']} is pending; only failed or dead or discarded jobs can be retried"
    )
    discarded = check(post(client, f"{JOBS}/{job['id']}/discard"), "/api/jobs/{job_id}/discard", "post")
    assert discarded["status"] == "discarded"
    again = check(post(client, f"{JOBS}/{job['id']}/retry"), "/api/jobs/{job_id}/retry", "post")
    assert again["status"] == "pending"
    assert post(client, f"{JOBS}/999/discard").status_code == 404


def test_list_filters_pagination_and_stats(client) -> None:
    ids = [post(client, JOBS, {"type": "demo.noop", "queue": "q1"}).get_json()["id"] for _ in range(5)]
    post(client, JOBS, {"type": "demo.sleep"})
    page = check(client.get(f"{JOBS}?type=demo.noop&limit=2"), "/api/jobs", "get")
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2] and page["next_cursor"] == ids[3]
    page2 = check(client.get(f"{JOBS}?type=demo.noop&limit=2&cursor={page['next_cursor']}"), "/api/jobs", "get")
    assert [j["id"] for j in page2["jobs"]] == ids[::-1][2:4]
    last = check(client.get(f"{JOBS}?queue=q1&limit=10&status=pending"), "/api/jobs", "get")
    assert len(last["jobs"]) == 5 and last["next_cursor"] is None
    for bad in ("status=lost", "limit=0", "limit=abc", "cursor=-1"):
        r = client.get(f"{JOBS}?{bad}")
        assert r.status_code == 422 and check(r, "/api/jobs", "get")["field"] == bad.split("=")[0]
    stats = check(client.get("/api/stats"), "/api/stats", "get")
    assert stats["counts"]["pending"] == 6 and stats["counts"]["dead"] == 0
    assert check(client.get(f"{JOBS}/424242"), "/api/jobs/{job_id}", "get")["error"] == "job 424242 does not exist"


def test_unknown_routes_and_methods_answer_json(client) -> None:
    r = client.get("/api/nothing-here")
    assert r.status_code == 404 and "error" in r.get_json()
    r = client.delete(JOBS)
    assert r.status_code == 405 and "error" in r.get_json()


def test_bearer_token(make_deck, clock) -> None:
    deck = make_deck(clock, api_token="s3cret")
    client = create_app(deck=deck).test_client()
    r = post(client, JOBS, {"type": "demo.noop"})
    assert r.status_code == 401 and check(r, "/api/jobs", "post")["error"] == "missing or invalid bearer token"
    assert post(client, JOBS, {"type": "demo.noop"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = post(client, JOBS, {"type": "demo.noop"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/openapi.json").status_code == 200


def test_twenty_concurrent_posts_with_one_key(live_deck: Jobdeck) -> None:
    """Over real HTTP, 20 threads race one idempotency key: one 201, nineteen 200s, one row."""
    from urllib.parse import urlsplit

    from tests.live_server import served

    barrier = threading.Barrier(20)
    results: list[tuple[int, int]] = []
    lock = threading.Lock()

    def send(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"type": "demo.noop", "payload": {"o": 1}, "idempotency_key": "race"})
        barrier.wait()
        conn.request("POST", JOBS, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        conn.close()
        with lock:
            results.append((resp.status, data["id"]))

    # ``served`` stops the server inside its own loop: closing it from this
    # thread while the loop selected on its sockets raised EBADF there.
    with served(create_app(deck=live_deck), threads=20) as url:
        port = urlsplit(url).port
        assert port is not None
        senders = [threading.Thread(target=send, args=(port,)) for _ in range(20)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(timeout=30)
    statuses = sorted(s for s, _ in results)
    assert statuses == [200] * 19 + [201]
    assert len({i for _, i in results}) == 1
    assert live_deck.store.counts(live_deck.clock())["pending"] == 1


@pytest.mark.parametrize("number", ["9223372036854775808", "99999999999999999999", "9" * 5000])
@pytest.mark.parametrize("method", ["get", "patch", "post", "put", "delete"])
def test_an_id_beyond_bigint_is_404_whatever_the_method(client, method: str, number: str) -> None:
    """No row can have such an id, so no job is named: 404. Werkzeug checks
    a rule's methods before its converter, and answered PATCH (and POST on
    the bare job URL) with 405 through the GET rule (found by the fuzzer)."""
    r = getattr(client, method)(f"/api/jobs/{number}", json={"priority": 1})
    assert r.status_code == 404, (r.status_code, r.get_data(as_text=True))
    assert "error" in r.get_json()


def test_a_real_method_not_allowed_stays_405(client) -> None:
    r = client.delete("/api/jobs/1")
    assert r.status_code == 405 and "error" in r.get_json()
