"""Workflows and batches over HTTP (``jobdeck.web.api.workflows``), on SQLite and
PostgreSQL: every endpoint, its 201/200/404/409/422 answers checked against
the OpenAPI document, the bearer token, and that a refused workflow or batch
addition inserts nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.validation import INT64_MAX
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.models import batches, job_dependencies, jobs, workflows
from sqlalchemy import func, select

from tests.openapi_check import check

pytestmark = pytest.mark.backends

WORKFLOWS = "/api/workflows"
BATCHES = "/api/batches"
DIAMOND = {
    "name": "diamond",
    "jobs": [
        {"name": "a", "type": "demo.noop", "payload": {"n": 1}},
        {"name": "b", "type": "demo.noop", "depends_on": ["a"]},
        {"name": "c", "type": "demo.noop", "depends_on": ["a"], "priority": "high", "queue": "reports"},
        {"name": "d", "type": "demo.noop", "depends_on": ["b", "c"], "max_retries": 0},
    ],
}


@pytest.fixture
def make_config(make_config: Any) -> Any:
    """This module's decks with a ``stall_timeout`` as long as a test may
    take (pytest's timeout). The store ends a PostgreSQL session left idle
    inside a transaction for ``max(10 s, stall_timeout)``, and the suite's
    5 s made that 10 s: starved of CPU (the quick tier at the lowest priority
    beside the full run and a busy loop), this test process sat that long
    between two statements of one transaction, lost its session, and the
    retry test failed on "server closed the connection unexpectedly". Nothing
    here runs on real time but that session limit: the decks' clock is the
    test's."""

    def make(**overrides: Any) -> Any:
        return make_config(**{"stall_timeout": 300.0, **overrides})

    return make


def _client(deck: Jobdeck) -> Any:
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return app.test_client()


def _post(client: Any, path: str, body: Any = None, **kw: Any) -> Any:
    if body is None:
        return client.post(path, **kw)
    return client.post(path, data=json.dumps(body), content_type="application/json", **kw)


def _rows(deck: Jobdeck) -> dict[str, int]:
    with deck.store.read() as conn:
        return {
            t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (workflows, jobs, job_dependencies, batches)
        }


def _run(deck: Jobdeck, *, fail: frozenset[str] = frozenset()) -> list[str]:
    """Claim and finish what is claimable until nothing is: complete each
    job, fail non-retryably those whose step is in ``fail``."""
    ran: list[str] = []
    while claimed := deck.store.claim("w1", deck.clock(), limit=10):
        ran += [j.step or str(j.id) for j in claimed]
        now = deck.clock()
        deck.store.complete_many(
            [Outcome(j.id, "w1", attempt=j.attempt, started_at=j.claimed_at) for j in claimed if j.step not in fail],
            now,
        )
        deck.store.fail_many(
            [Outcome(j.id, "w1", attempt=j.attempt, error="boom", retryable=False) for j in claimed if j.step in fail],
            now,
        )
    return ran


# -- enqueue -----------------------------------------------------------------------


def test_a_workflow_is_enqueued_with_every_job_id_and_read_back_as_a_graph(client, deck) -> None:
    r = _post(client, WORKFLOWS, DIAMOND)
    made = check(r, "/api/workflows", "post")
    assert r.status_code == 201 and made["created"] is True and made["name"] == "diamond"
    ids = made["jobs"]
    assert sorted(ids) == ["a", "b", "c", "d"]

    graph = check(client.get(f"{WORKFLOWS}/{made['id']}"), "/api/workflows/{workflow_id}", "get")
    assert graph["id"] == made["id"] and graph["state"] == "running" and graph["total"] == 4
    assert graph["counts"] == {"pending": 1, "blocked": 3} and graph["done"] == 0
    by_step = {j["step"]: j for j in graph["jobs"]}
    assert {s: j["id"] for s, j in by_step.items()} == ids
    assert {s: j["status"] for s, j in by_step.items()} == {"a": "pending", "b": "blocked", "c": "blocked",
                                                             "d": "blocked"}  # fmt: skip
    assert {s: j["deps_left"] for s, j in by_step.items()} == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert (by_step["c"]["priority"], by_step["c"]["queue"], by_step["d"]["max_retries"]) == (20, "reports", 0)
    assert "payload" not in by_step["a"]
    edges = {(e["job"], e["depends_on"]) for e in graph["edges"]}
    assert edges == {(ids["b"], ids["a"]), (ids["c"], ids["a"]), (ids["d"], ids["b"]), (ids["d"], ids["c"])}

    # The job API shows the new fields, and lists blocked jobs by state.
    job = check(client.get(f"/api/jobs/{ids['d']}"), "/api/jobs/{job_id}", "get")
    assert (job["workflow_id"], job["batch_id"], job["step"], job["status"]) == (made["id"], None, "d", "blocked")
    assert client.get(f"/api/jobs/{ids['a']}").get_json()["payload"] == {"n": 1}
    blocked = check(client.get("/api/jobs?status=blocked"), "/api/jobs", "get")["jobs"]
    assert sorted(j["id"] for j in blocked) == sorted([ids["b"], ids["c"], ids["d"]])

    assert _run(deck)[0] == "a"
    done = check(client.get(f"{WORKFLOWS}/{made['id']}"), "/api/workflows/{workflow_id}", "get")
    assert done["state"] == "completed" and done["counts"] == {"completed": 4} and done["done"] == 4


def test_a_key_enqueues_the_workflow_once_and_answers_200_after(client, deck) -> None:
    body = {**DIAMOND, "key": "diamond:2026-12-01", "on_dependency_failure": "hold"}
    first = _post(client, WORKFLOWS, body)
    again = _post(client, WORKFLOWS, body)
    assert (first.status_code, again.status_code) == (201, 200)
    repeat = check(again, "/api/workflows", "post")
    assert repeat["created"] is False
    assert (repeat["id"], repeat["jobs"]) == (first.get_json()["id"], first.get_json()["jobs"])
    assert _rows(deck)["workflows"] == 1 and _rows(deck)["jobs"] == 4
    shown = client.get(f"{WORKFLOWS}/{repeat['id']}").get_json()
    assert (shown["key"], shown["on_dependency_failure"]) == ("diamond:2026-12-01", "hold")


def _jobs(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "wf", "jobs": list(steps)}


REFUSED = [
    (
        _jobs(
            {"name": "a", "type": "demo.noop", "depends_on": ["b"]},
            {"name": "b", "type": "demo.noop", "depends_on": ["a"]},
        ),
        "jobs",
        "cycle",
    ),  # fmt: skip
    (_jobs({"name": "a", "type": "demo.noop", "depends_on": ["a"]}), "jobs[0].depends_on", "itself"),
    (_jobs({"name": "a", "type": "demo.noop", "depends_on": ["zz"]}), "jobs[0].depends_on", "not a job"),
    (_jobs({"name": "a", "type": "demo.noop"}, {"name": "a", "type": "demo.noop"}), "jobs[1].name", "two jobs"),
    (_jobs({"name": "a", "type": "demo.noop"}, {"name": "b", "type": "demo.nope"}), "jobs[1].type", "unknown"),
    (_jobs({"name": "a", "type": "demo.noop", "priority": "urgent"}), "jobs[0].priority", ""),
    (_jobs({"name": "a", "type": "demo.noop", "colour": "red"}), "jobs[0].colour", ""),
    (_jobs({"name": "a", "type": "demo.noop", "idempotency_key": "k"}), "jobs[0].idempotency_key", "not allowed"),
    (_jobs({"name": "a", "type": "demo.noop", "unique": True}), "jobs[0].unique", "not allowed"),
    (
        _jobs({"name": "a", "type": "demo.noop", "on_dependency_failure": "ignore"}),
        "jobs[0].on_dependency_failure",
        "one of",
    ),  # fmt: skip
    (_jobs({"name": "a\x00b", "type": "demo.noop"}), "jobs[0].name", "NUL"),
    (_jobs({"name": "  ", "type": "demo.noop"}), "jobs[0].name", "required"),
    (_jobs({"name": "a", "type": "demo.noop", "depends_on": "b"}), "jobs[0].depends_on", "list"),
    (_jobs("a"), "jobs[0]", "object"),
    ({"name": "wf\x00", "jobs": [{"name": "a", "type": "demo.noop"}]}, "name", "NUL"),
    ({"name": "wf", "jobs": []}, "jobs", "non-empty"),
    ({"name": "wf"}, "jobs", "required"),
    ({"jobs": [{"name": "a", "type": "demo.noop"}]}, "name", "required"),
    ({**_jobs({"name": "a", "type": "demo.noop"}), "on_dependency_failure": "maybe"}, "on_dependency_failure", ""),
    ({**_jobs({"name": "a", "type": "demo.noop"}), "key": ""}, "key", ""),
    ({**_jobs({"name": "a", "type": "demo.noop"}), "owner": "me"}, "owner", "unknown field"),
    ([DIAMOND], "body", "object"),
]


@pytest.mark.parametrize(("body", "field", "words"), REFUSED, ids=[f"{i}-{r[1]}" for i, r in enumerate(REFUSED)])
def test_a_refused_workflow_is_422_naming_the_field_and_inserts_nothing(client, deck, body, field, words) -> None:
    r = _post(client, WORKFLOWS, body)
    answer = check(r, "/api/workflows", "post")
    assert r.status_code == 422 and answer["field"] == field, answer
    assert words in answer["error"]
    assert _rows(deck) == {"workflows": 0, "jobs": 0, "job_dependencies": 0, "batches": 0}


def test_more_jobs_than_max_jobs_is_422_and_inserts_nothing(make_deck, clock) -> None:
    deck = make_deck(clock, workflows={"max_jobs": 3})
    client = _client(deck)
    body = _jobs(*[{"name": f"j{i}", "type": "demo.noop"} for i in range(4)])
    r = _post(client, WORKFLOWS, body)
    assert r.status_code == 422 and "at most 3 jobs" in check(r, "/api/workflows", "post")["error"]
    assert _rows(deck)["jobs"] == 0
    assert _post(client, WORKFLOWS, {**body, "jobs": body["jobs"][:3]}).status_code == 201


def test_hostile_bodies_are_clear_4xx_and_insert_nothing(make_deck, clock) -> None:
    deck = make_deck(clock, max_payload_bytes=1024)
    client = _client(deck)
    deep = "[" * 10_000 + "]" * 10_000
    raw = f'{{"name": "wf", "jobs": [{{"name": "a", "type": "demo.noop", "payload": {{"x": {deep}}}}}]}}'
    r = client.post(WORKFLOWS, data=raw, content_type="application/json")
    assert r.status_code == 422 and check(r, "/api/workflows", "post")["field"]
    r = client.post(WORKFLOWS, data='{"name": "wf", "jobs": [', content_type="application/json")
    assert r.status_code == 400 and check(r, "/api/workflows", "post")["error"] == "malformed JSON in request body"
    r = client.post(WORKFLOWS, data=json.dumps(DIAMOND), content_type="text/plain")
    assert r.status_code == 415 and check(r, "/api/workflows", "post")["error"]
    big = _jobs({"name": "a", "type": "demo.noop", "payload": {"blob": "x" * 2000}})
    r = _post(client, WORKFLOWS, big)
    assert r.status_code == 413 and "1024 bytes" in check(r, "/api/workflows", "post")["error"]
    huge = _jobs(*[{"name": f"j{i}", "type": "demo.noop", "payload": {"b": "x" * 900}} for i in range(100)])
    r = _post(client, WORKFLOWS, huge)
    assert r.status_code == 413 and check(r, "/api/workflows", "post")["error"].startswith(
        "request body too large: at most "
    )
    assert _rows(deck) == {"workflows": 0, "jobs": 0, "job_dependencies": 0, "batches": 0}


# -- list and show -----------------------------------------------------------------


def test_workflows_are_listed_newest_first_by_pages_and_by_name(client) -> None:
    made = [_post(client, WORKFLOWS, {**DIAMOND, "name": name}).get_json()["id"] for name in ("x", "y", "x", "x")]
    first = check(client.get(f"{WORKFLOWS}?limit=3"), "/api/workflows", "get")
    assert [w["id"] for w in first["workflows"]] == made[::-1][:3]
    assert first["next_before"] == made[1]
    rest = check(client.get(f"{WORKFLOWS}?limit=3&before={first['next_before']}"), "/api/workflows", "get")
    assert [w["id"] for w in rest["workflows"]] == [made[0]] and rest["next_before"] is None
    named = check(client.get(f"{WORKFLOWS}?name=x"), "/api/workflows", "get")
    assert [w["id"] for w in named["workflows"]] == [made[3], made[2], made[0]]
    listed = named["workflows"][0]
    assert (listed["state"], listed["total"], listed["counts"]) == ("running", 4, {"pending": 1, "blocked": 3})
    assert check(client.get(f"{WORKFLOWS}?name=none"), "/api/workflows", "get")["workflows"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("limit=0", "limit"), ("limit=201", "limit"), ("limit=x", "limit"), ("before=0", "before"),
     (f"before={2**63}", "before"), ("before=%C2%B2", "before"), ("name=a%00b", "name"), (f"name={'n' * 201}", "name")],
)  # fmt: skip
def test_bad_list_arguments_are_422_naming_them(client, query: str, field: str) -> None:
    for path in (WORKFLOWS, BATCHES):
        if field == "name" and path == BATCHES:
            continue
        r = client.get(f"{path}?{query}")
        assert r.status_code == 422 and check(r, path, "get")["field"] == field


def test_unknown_workflows_and_batches_are_404(client) -> None:
    for path in (f"{WORKFLOWS}/424242", f"{BATCHES}/424242", f"{WORKFLOWS}/{INT64_MAX}"):
        r = client.get(path)
        assert r.status_code == 404 and "does not exist" in r.get_json()["error"]
    assert check(client.get(f"{WORKFLOWS}/424242"), "/api/workflows/{workflow_id}", "get")
    for action in ("retry", "cancel"):
        r = _post(client, f"{WORKFLOWS}/424242/{action}")
        assert r.status_code == 404 and "workflow 424242" in check(r, f"/api/workflows/{{workflow_id}}/{action}",
                                                                    "post")["error"]  # fmt: skip
    for suffix, body in (("/jobs", {"jobs": [{"type": "demo.noop"}]}), ("/close", None)):
        r = _post(client, f"{BATCHES}/424242{suffix}", body)
        assert r.status_code == 404 and "batch 424242" in check(r, f"/api/batches/{{batch_id}}{suffix}", "post")[
            "error"]  # fmt: skip
    for number in (str(2**63), "9" * 40):
        assert client.get(f"{WORKFLOWS}/{number}").status_code == 404
        assert _post(client, f"{WORKFLOWS}/{number}/retry").status_code == 404
        assert _post(client, f"{BATCHES}/{number}/close").status_code == 404


# -- retry and cancel ----------------------------------------------------------------


def test_retry_moves_the_failed_part_and_the_held_graph_then_runs(client, deck) -> None:
    made = _post(client, WORKFLOWS, {**DIAMOND, "on_dependency_failure": "hold"}).get_json()
    ids, wf = made["jobs"], made["id"]
    assert sorted(_run(deck, fail=frozenset({"b"}))) == ["a", "b", "c"]
    held = client.get(f"{WORKFLOWS}/{wf}").get_json()
    assert held["state"] == "held" and held["counts"] == {"completed": 2, "dead": 1, "blocked": 1}

    r = _post(client, f"{WORKFLOWS}/{wf}/retry")
    moved = check(r, "/api/workflows/{workflow_id}/retry", "post")
    assert r.status_code == 200 and moved["moved"] == [ids["b"]] and moved["workflow"]["state"] == "running"
    assert _run(deck) == ["b", "d"]
    assert client.get(f"{WORKFLOWS}/{wf}").get_json()["state"] == "completed"
    again = check(_post(client, f"{WORKFLOWS}/{wf}/retry"), "/api/workflows/{workflow_id}/retry", "post")
    assert again["moved"] == []
    with deck.store.read() as conn:
        from jobdeck.store.models import audit_log

        actions = conn.execute(select(audit_log.c.actor, audit_log.c.action, audit_log.c.count,
                                      audit_log.c.detail).order_by(audit_log.c.id)).all()  # fmt: skip
    assert [tuple(a) for a in actions] == [("api", "retry", 1, f"workflow {wf}"), ("api", "retry", 0, f"workflow {wf}")]


def test_cancel_moves_the_rest_and_a_running_job_is_asked_to_stop(client, deck) -> None:
    made = _post(client, WORKFLOWS, DIAMOND).get_json()
    ids, wf = made["jobs"], made["id"]
    (a,) = deck.store.claim("w1", deck.clock(), limit=1)
    r = _post(client, f"{WORKFLOWS}/{wf}/cancel")
    moved = check(r, "/api/workflows/{workflow_id}/cancel", "post")
    assert r.status_code == 200 and moved["moved"] == [ids["a"], ids["b"], ids["c"], ids["d"]]
    assert moved["workflow"]["counts"] == {"running": 1, "cancelled": 3}
    assert deck.store.get(a.id).cancel_requested_at is not None
    deck.store.complete_many([Outcome(a.id, "w1", attempt=a.attempt, started_at=a.claimed_at)], deck.clock())
    shown = client.get(f"{WORKFLOWS}/{wf}").get_json()
    assert shown["state"] == "cancelled" and shown["counts"] == {"cancelled": 4}
    assert check(_post(client, f"{WORKFLOWS}/{wf}/cancel"), "/api/workflows/{workflow_id}/cancel", "post")[
        "moved"] == []  # fmt: skip


# -- batches -------------------------------------------------------------------------


def test_a_batch_is_opened_filled_closed_and_fires_once(client, deck) -> None:
    body = {"name": "regions", "on_complete": "demo.noop", "on_success": {"type": "demo.noop", "payload": {"m": 1}}}
    r = _post(client, BATCHES, body)
    opened = check(r, "/api/batches", "post")
    assert r.status_code == 201 and opened["state"] == "open" and opened["name"] == "regions"
    assert set(opened["callbacks"]) == {"on_complete", "on_success"}
    bid = opened["id"]

    r = _post(client, f"{BATCHES}/{bid}/jobs", {"jobs": [{"type": "demo.noop", "payload": {"r": r_}} for r_ in "ab"]})
    added = check(r, "/api/batches/{batch_id}/jobs", "post")
    assert r.status_code == 201 and len(added["ids"]) == 2
    more = check(_post(client, f"{BATCHES}/{bid}/jobs", {"jobs": [{"type": "demo.noop", "queue": "q2"}]}),
                 "/api/batches/{batch_id}/jobs", "post")["ids"]  # fmt: skip
    job = client.get(f"/api/jobs/{more[0]}").get_json()
    assert (job["batch_id"], job["workflow_id"], job["queue"]) == (bid, None, "q2")

    shown = check(client.get(f"{BATCHES}/{bid}"), "/api/batches/{batch_id}", "get")
    assert (shown["state"], shown["total"], shown["counts"], shown["fired_at"]) == ("open", 3, {"pending": 3}, None)
    r = _post(client, f"{BATCHES}/{bid}/close")
    closed = check(r, "/api/batches/{batch_id}/close", "post")
    assert r.status_code == 200 and closed["state"] == "running" and closed["closed_at"]

    r = _post(client, f"{BATCHES}/{bid}/jobs", {"jobs": [{"type": "demo.noop"}]})
    assert r.status_code == 409 and "closed" in check(r, "/api/batches/{batch_id}/jobs", "post")["error"]
    r = _post(client, f"{BATCHES}/{bid}/close")
    assert r.status_code == 409 and check(r, "/api/batches/{batch_id}/close", "post")
    assert _rows(deck)["jobs"] == 3

    ran = _run(deck)
    assert len(ran) == 5  # three jobs, then on_complete and on_success
    fired = check(client.get(f"{BATCHES}/{bid}"), "/api/batches/{batch_id}", "get")
    assert fired["state"] == "fired" and fired["fired_at"] and fired["done"] == 3
    assert fired["outcome"]["counts"] == {"completed": 3} and set(fired["outcome"]["callbacks"]) == set(
        body) - {"name"}  # fmt: skip
    callback = deck.store.get(fired["outcome"]["callbacks"]["on_success"])
    assert callback.payload["m"] == 1 and callback.payload["batch"]["job_ids"] == added["ids"] + more


def test_an_empty_body_opens_a_nameless_batch_and_batches_are_listed_newest_first(client) -> None:
    made = [check(_post(client, BATCHES), "/api/batches", "post")["id"] for _ in range(3)]
    page = check(client.get(f"{BATCHES}?limit=2"), "/api/batches", "get")
    assert [b["id"] for b in page["batches"]] == made[::-1][:2] and page["next_before"] == made[1]
    rest = check(client.get(f"{BATCHES}?before={made[1]}"), "/api/batches", "get")
    assert [b["id"] for b in rest["batches"]] == [made[0]] and rest["next_before"] is None
    assert page["batches"][0]["name"] is None and page["batches"][0]["callbacks"] == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [({"on_complete": "demo.nope"}, "on_complete.type"), ({"on_dead": 7}, "on_dead"),
     ({"on_success": {"type": "demo.noop", "idempotency_key": "k"}}, "on_success.idempotency_key"), ({"name": "a\x00"}, "name"),
     ({"name": ""}, "name"), ({"on_finish": "demo.noop"}, "on_finish")],
)  # fmt: skip
def test_a_refused_batch_is_422_and_opens_nothing(client, deck, body, field) -> None:
    r = _post(client, BATCHES, body)
    assert r.status_code == 422 and check(r, "/api/batches", "post")["field"] == field
    assert _rows(deck)["batches"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [({"jobs": []}, "jobs"), ({}, "jobs"), ({"jobs": {"type": "demo.noop"}}, "jobs"),
     ({"jobs": [{"type": "demo.noop"}, {"type": "demo.nope"}]}, "jobs[1].type"),
     ({"jobs": [{"type": "demo.noop"}, "demo.noop"]}, "jobs[1]"),
     ({"jobs": [{"type": "demo.noop", "idempotency_key": "k"}]}, "jobs[0].idempotency_key"),
     ({"jobs": [{"type": "demo.noop", "unique": True}]}, "jobs[0].unique"),
     ({"jobs": [{"type": "demo.noop", "queue": "q\x00"}]}, "jobs[0].queue"),
     ({"jobs": [{"type": "demo.noop"}], "close": True}, "close"),
     ({"jobs": [{"type": "demo.noop"}] * 4}, "jobs")],
)  # fmt: skip
def test_refused_batch_jobs_are_422_and_insert_none(make_deck, clock, body, field) -> None:
    deck = make_deck(clock, workflows={"max_jobs": 3})
    client = _client(deck)
    bid = _post(client, BATCHES).get_json()["id"]
    r = _post(client, f"{BATCHES}/{bid}/jobs", body)
    assert r.status_code == 422 and check(r, "/api/batches/{batch_id}/jobs", "post")["field"] == field
    assert _rows(deck)["jobs"] == 0


# -- auth ----------------------------------------------------------------------------


def test_every_endpoint_needs_the_token(make_deck, clock) -> None:
    deck = make_deck(clock, api_token="s3cret")
    client = _client(deck)
    good = {"Authorization": "Bearer s3cret"}
    wf = _post(client, WORKFLOWS, DIAMOND, headers=good)
    bid = _post(client, BATCHES, {}, headers=good).get_json()["id"]
    assert wf.status_code == 201
    wid = wf.get_json()["id"]
    calls = [
        ("post", "/api/workflows", WORKFLOWS, DIAMOND),
        ("get", "/api/workflows", WORKFLOWS, None),
        ("get", "/api/workflows/{workflow_id}", f"{WORKFLOWS}/{wid}", None),
        ("post", "/api/workflows/{workflow_id}/retry", f"{WORKFLOWS}/{wid}/retry", None),
        ("post", "/api/workflows/{workflow_id}/cancel", f"{WORKFLOWS}/{wid}/cancel", None),
        ("post", "/api/batches", BATCHES, {}),
        ("get", "/api/batches", BATCHES, None),
        ("get", "/api/batches/{batch_id}", f"{BATCHES}/{bid}", None),
        ("post", "/api/batches/{batch_id}/jobs", f"{BATCHES}/{bid}/jobs", {"jobs": [{"type": "demo.noop"}]}),
        ("post", "/api/batches/{batch_id}/close", f"{BATCHES}/{bid}/close", None),
    ]
    before = _rows(deck)
    for method, doc_path, url, body in calls:
        for headers in ({}, {"Authorization": "Bearer nope"}):
            r = _post(client, url, body, headers=headers) if method == "post" else client.get(url, headers=headers)
            assert r.status_code == 401, (method, url, headers)
            assert check(r, doc_path, method)["error"] == "missing or invalid bearer token"
    assert _rows(deck) == before
    assert _post(client, f"{WORKFLOWS}/{wid}/cancel", headers=good).status_code == 200
    assert _post(client, f"{BATCHES}/{bid}/close", headers=good).status_code == 200
    assert deck.store.workflow(wid).workflow.state == "cancelled" and deck.store.batch(bid).state == "fired"


def test_a_blocked_jobs_waiting_reason_is_its_dependencies(client: Any, deck: Jobdeck) -> None:
    wf = deck.workflow("pair").add("a", "demo.noop").add("b", "demo.noop", depends_on=["a"]).enqueue()
    body = client.get(f"/api/jobs/{wf.jobs['b']}").get_json()
    assert body["waiting_reason"] == {
        "code": "dependencies",
        "message": "Waiting for 1 dependency to complete",
        "left": 1,
    }
