"""Hostile input to the workflow and batch API (``jobdeck.web.api.workflows``):
NUL bytes and broken Unicode where a name goes, JSON nested 10,000 deep,
ids past BIGINT, graphs at the size limits, and races over real HTTP. Each
is a clear 4xx with a JSON message naming the field, or a correct answer,
and a refused request inserts nothing. On SQLite and PostgreSQL (a NUL in
text is a DataError there, a duplicate key an IntegrityError)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from jobdeck import create_app
from jobdeck.store import Outcome
from jobdeck.store.models import batches, job_dependencies, jobs, workflows
from live_server import served
from sqlalchemy import func, select
from test_hostile_input import BEYOND, FOREIGN_DIGITS, nested, refused, send

pytestmark = pytest.mark.backends

WORKFLOWS = "/api/workflows"
BATCHES = "/api/batches"
NOOP = "demo.noop"


def _rows(deck: Any) -> dict[str, int]:
    with deck.store.read() as conn:
        return {
            t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (workflows, jobs, job_dependencies, batches)
        }


EMPTY = {"workflows": 0, "jobs": 0, "job_dependencies": 0, "batches": 0}


def _one(name: str = "a", **job: Any) -> dict[str, Any]:
    return {"name": "wf", "jobs": [{"name": name, "type": NOOP, **job}]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "w\x00f", "jobs": [{"name": "a", "type": NOOP}]}, "name"),
        (_one("a\x00"), "jobs[0].name"),
        (_one("a", depends_on=["a\x00"]), "jobs[0].depends_on[0]"),
        ({**_one(), "key": "k\x00"}, "key"),
        (_one("a", queue="q\x00"), "jobs[0].queue"),
        (_one("a", payload={"t": "x\x00y"}), None),
        (_one("n" * 201), "jobs[0].name"),
        ({**_one(), "key": "k" * 256}, "key"),
        ({"name": "w" * 201, "jobs": [{"name": "a", "type": NOOP}]}, "name"),
        (_one("a", depends_on=[1]), "jobs[0].depends_on"),
        (_one("a", depends_on=[None]), "jobs[0].depends_on"),
        ({"name": ["wf"], "jobs": [{"name": "a", "type": NOOP}]}, "name"),
        ({"name": "wf", "jobs": "a"}, "jobs"),
    ],
)
def test_hostile_names_and_keys_are_422_and_insert_nothing(client, deck, body: Any, field: str | None) -> None:
    answer = send(client, WORKFLOWS, body)
    if field is None:  # a NUL inside a payload is JSON data and is kept, escaped
        assert answer.status_code == 201, answer.get_json()
        job_id = answer.get_json()["jobs"]["a"]
        assert deck.store.get(job_id).payload == {"t": "x\x00y"}
        return
    refused(answer, 422, field)
    assert _rows(deck) == EMPTY


def test_broken_unicode_in_a_step_name_is_refused(client, deck) -> None:
    raw = '{"name": "wf", "jobs": [{"name": "\\ud800", "type": "demo.noop"}]}'
    refused(client.post(WORKFLOWS, data=raw, content_type="application/json"), 422)
    raw = '{"name": "wf", "jobs": [{"name": "a", "type": "demo.noop", "depends_on": ["\\udfff"]}]}'
    refused(client.post(WORKFLOWS, data=raw, content_type="application/json"), 422)
    assert _rows(deck) == EMPTY


@pytest.mark.parametrize("depth", [100, 10_000])
def test_deep_json_anywhere_in_a_workflow_or_batch_is_refused(client, deck, depth: int) -> None:
    deep = nested(depth)
    bodies = [
        deep,
        f'{{"name": "wf", "jobs": {deep}}}',
        f'{{"name": "wf", "jobs": [{{"name": "a", "type": "demo.noop", "depends_on": {deep}}}]}}',
        f'{{"name": "wf", "jobs": [{{"name": "a", "type": "demo.noop", "payload": {{"x": {deep}}}}}]}}',
    ]
    for raw in bodies:
        refused(client.post(WORKFLOWS, data=raw, content_type="application/json"), (400, 422))
    batch_id = send(client, BATCHES, {}).get_json()["id"]
    refused(client.post(BATCHES, data=f'{{"on_complete": {deep}}}', content_type="application/json"), (400, 422))
    raw = f'{{"jobs": [{{"type": "demo.noop", "payload": {deep}}}]}}'
    refused(client.post(f"{BATCHES}/{batch_id}/jobs", data=raw, content_type="application/json"), (400, 422))
    assert _rows(deck) == {**EMPTY, "batches": 1}


def test_ids_past_bigint_and_in_foreign_digits_are_404_or_422(client) -> None:
    for number in BEYOND:
        for path in (f"{WORKFLOWS}/{number}", f"{BATCHES}/{number}"):
            refused(client.get(path), 404)
        for path in (f"{WORKFLOWS}/{number}/retry", f"{WORKFLOWS}/{number}/cancel", f"{BATCHES}/{number}/close"):
            refused(send(client, path, {}), 404)
        refused(send(client, f"{BATCHES}/{number}/jobs", {"jobs": [{"type": NOOP}]}), 404)
    for number in BEYOND + FOREIGN_DIGITS:
        for path in (WORKFLOWS, BATCHES):
            refused(client.get(path, query_string={"before": number}), 422, "before")
            refused(client.get(path, query_string={"limit": number}), 422, "limit")


def test_a_chain_as_long_as_max_jobs_is_taken_and_as_a_cycle_refused(client, deck) -> None:
    """1000 jobs (the default ``max_jobs``) each after the one before: taken
    whole; closed into one ring, refused with nothing inserted (the ordering
    and the cycle's message are loops, not recursion)."""
    chain = [{"name": f"j{i}", "type": NOOP, "depends_on": [f"j{i - 1}"] if i else []} for i in range(1000)]
    ring = [{**chain[0], "depends_on": ["j999"]}, *chain[1:]]
    answer = refused(send(client, WORKFLOWS, {"name": "ring", "jobs": ring}), 422, "jobs")
    assert "cycle" in answer["error"] and _rows(deck) == EMPTY
    made = send(client, WORKFLOWS, {"name": "chain", "jobs": chain})
    assert made.status_code == 201 and len(made.get_json()["jobs"]) == 1000
    assert _rows(deck)["job_dependencies"] == 999
    too_many = [*chain, {"name": "j1000", "type": NOOP}]
    refused(send(client, WORKFLOWS, {"name": "more", "jobs": too_many}), 422, "jobs")
    assert _rows(deck)["jobs"] == 1000


def test_a_dense_graph_within_the_body_cap_is_inserted_whole(client, deck) -> None:
    """150 jobs, each after every one before it: 11,175 edges in one
    transaction, read back with every edge."""
    items = [{"name": f"j{i}", "type": NOOP, "depends_on": [f"j{k}" for k in range(i)]} for i in range(150)]
    made = send(client, WORKFLOWS, {"name": "dense", "jobs": items})
    assert made.status_code == 201, made.get_json()
    graph = client.get(f"{WORKFLOWS}/{made.get_json()['id']}").get_json()
    assert len(graph["edges"]) == 150 * 149 // 2 and graph["counts"] == {"pending": 1, "blocked": 149}


def test_markup_in_names_comes_back_as_json_text(client) -> None:
    hostile = "<script>alert(1)</script>\"'&"
    made = send(client, WORKFLOWS, {"name": hostile, "jobs": [{"name": hostile, "type": NOOP}]})
    assert made.status_code == 201 and made.mimetype == "application/json"
    graph = client.get(f"{WORKFLOWS}/{made.get_json()['id']}")
    assert graph.mimetype == "application/json" and graph.get_json()["name"] == hostile
    assert graph.get_json()["jobs"][0]["step"] == hostile
    opened = send(client, BATCHES, {"name": hostile})
    assert opened.status_code == 201 and opened.get_json()["name"] == hostile


# -- races over real HTTP --------------------------------------------------------------


def _race(url: str, n: int, request: Callable[[int], tuple[str, str, Any]]) -> list[tuple[int, Any]]:
    """``n`` threads each send ``request(i)`` (method, path, body) at once
    over their own connection; their (status, JSON) in thread order."""
    parts = urlsplit(url)
    barrier = threading.Barrier(n)
    results: list[tuple[int, Any]] = [(0, None)] * n

    def one(i: int) -> None:
        method, path, body = request(i)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        barrier.wait()
        conn.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        results[i] = (response.status, json.loads(response.read()))
        conn.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    return results


def test_twenty_concurrent_enqueues_with_one_key_make_one_workflow(deck) -> None:
    body = {"name": "nightly", "key": "nightly:2026-12-01", "jobs": [{"name": "a", "type": NOOP},
            {"name": "b", "type": NOOP, "depends_on": ["a"]}]}  # fmt: skip
    with served(create_app(deck=deck), threads=20) as url:
        results = _race(url, 20, lambda i: ("POST", WORKFLOWS, body))
    assert sorted(status for status, _ in results) == [200] * 19 + [201], results
    answers = [answer for _, answer in results]
    assert sum(answer.pop("created") for answer in answers) == 1
    assert len({json.dumps(answer, sort_keys=True) for answer in answers}) == 1  # all name the one workflow
    assert _rows(deck) == {**EMPTY, "workflows": 1, "jobs": 2, "job_dependencies": 1}


def test_adds_racing_a_close_either_land_before_it_or_are_409(deck) -> None:
    """Ten threads add a job to a batch while one closes it: every 201's job
    is in the batch, every 409 added none, and the batch fires once, after
    the last of them ends, counting exactly the 201s."""
    client = create_app(deck=deck).test_client()
    batch_id = send(client, BATCHES, {"on_complete": NOOP}).get_json()["id"]
    path = f"{BATCHES}/{batch_id}"

    def request(i: int) -> tuple[str, str, Any]:
        if i == 5:
            return "POST", f"{path}/close", {}
        return "POST", f"{path}/jobs", {"jobs": [{"type": NOOP, "payload": {"i": i}}]}

    with served(create_app(deck=deck), threads=11) as url:
        results = _race(url, 11, request)
    assert results[5][0] == 200, results[5]
    adds = [r for i, r in enumerate(results) if i != 5]
    assert {status for status, _ in adds} <= {201, 409}, adds
    added = sorted(job_id for status, answer in adds if status == 201 for job_id in answer["ids"])
    assert sorted(j.id for j in deck.store.batch_jobs(batch_id)) == added
    while claimed := deck.store.claim("w1", deck.clock(), limit=20):
        deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in claimed], deck.clock())
    fired = client.get(path).get_json()
    assert fired["state"] == "fired" and fired["outcome"]["counts"] == ({"completed": len(added)} if added else {})
    assert sorted(deck.store.get(fired["outcome"]["callbacks"]["on_complete"]).payload["batch"]["job_ids"]) == added


def test_a_cross_site_browser_call_is_refused_and_changes_nothing(client, deck) -> None:
    """Without the bearer token, a browser's cross-site POST is refused
    (``jobdeck.web.guard``): another site's page cannot enqueue, cancel or close."""
    made = send(client, WORKFLOWS, {"name": "wf", "jobs": [{"name": "a", "type": NOOP}]}).get_json()
    batch_id = send(client, BATCHES, {}).get_json()["id"]
    before = _rows(deck)
    stranger = {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}
    for path, body in (
        (WORKFLOWS, {"name": "wf", "jobs": [{"name": "a", "type": NOOP}]}),
        (f"{WORKFLOWS}/{made['id']}/cancel", {}),
        (f"{WORKFLOWS}/{made['id']}/retry", {}),
        (BATCHES, {}),
        (f"{BATCHES}/{batch_id}/jobs", {"jobs": [{"type": NOOP}]}),
        (f"{BATCHES}/{batch_id}/close", {}),
    ):
        refused(client.post(path, data=json.dumps(body), content_type="application/json", headers=stranger), 403)
    assert _rows(deck) == before and deck.store.batch(batch_id).state == "open"
    assert deck.store.workflow(made["id"]).workflow.state == "running"


def test_a_repeated_key_answers_the_stored_workflow_and_another_name_is_a_conflict(client) -> None:
    first = send(client, WORKFLOWS, {"name": "first", "key": "k1", "jobs": [{"name": "a", "type": NOOP}]}).get_json()
    again = send(client, WORKFLOWS, {"name": "first", "key": "k1", "jobs": [{"name": "a", "type": NOOP}]})
    assert again.status_code == 200 and again.get_json()["id"] == first["id"]
    assert again.get_json()["name"] == client.get(f"{WORKFLOWS}/{first['id']}").get_json()["name"] == "first"
    other = send(client, WORKFLOWS, {"name": "second", "key": "k1", "jobs": [{"name": "a", "type": NOOP}]})
    assert other.status_code == 409 and other.get_json()["workflow_id"] == first["id"]
    squat = send(client, WORKFLOWS, {"name": "x", "key": "schedule:n:2026-12-01T02:00:00+00:00",
                                     "jobs": [{"name": "a", "type": NOOP}]})  # fmt: skip
    assert squat.status_code == 422 and squat.get_json()["field"] == "key"
