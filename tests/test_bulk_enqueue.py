"""``POST /api/jobs/bulk`` (``jobdeck.web.api.bulk``, ``Jobdeck.enqueue_bulk``) on
both databases: each job checked and answered as ``POST /api/jobs`` checks
and answers one, in order, in one transaction; one refused job refuses the
call with its index, and nothing is inserted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.errors import ItemRefused
from jobdeck.core.validation import max_body_bytes
from jobdeck.deck import Jobdeck

from tests.openapi_check import check

pytestmark = pytest.mark.backends

BULK = "/api/jobs/bulk"


def bulk(client: Any, jobs: Any, **kw: Any) -> Any:
    return client.post(BULK, json={"jobs": jobs}, **kw)


def answered(r: Any) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = check(r, BULK, "post")["jobs"]
    return jobs


def padded(body: str, size: int) -> bytes:
    """``body`` with white space after it, ``size`` bytes in all: still the same JSON."""
    data = body.encode()
    assert len(data) <= size
    return data + b" " * (size - len(data))


def total(deck: Jobdeck) -> int:
    return sum(deck.store.counts(deck.clock()).values())


def test_jobs_are_enqueued_in_the_order_given_each_as_one_would_be(client: Any, deck: Jobdeck) -> None:
    items = [
        {"type": "demo.noop", "payload": {"n": 0}},
        {"type": "demo.send-email", "payload": {"user_id": "u1"}, "priority": "high", "queue": "mail"},
        {"type": "demo.noop", "payload": {"n": 2}, "delay_seconds": 60, "max_retries": 0},
        {"type": "demo.noop"},
    ]
    r = bulk(client, items)
    assert r.status_code == 201
    got = answered(r)
    assert [(j["created"], j["duplicate"], j["replaced"]) for j in got] == [(True, False, False)] * 4
    ids = [j["id"] for j in got]
    assert ids == sorted(ids) and len(set(ids)) == 4, "ids follow the list"
    jobs = [deck.store.get(i) for i in ids]
    assert [(j.type, j.payload) for j in jobs] == [
        ("demo.noop", {"n": 0}), ("demo.send-email", {"user_id": "u1"}), ("demo.noop", {"n": 2}), ("demo.noop", {}),
    ]  # fmt: skip
    assert (jobs[1].priority, jobs[1].queue) == (20, "mail")
    assert jobs[2].max_retries == 0 and jobs[2].available_at > deck.clock()
    single = client.post("/api/jobs", json=items[1]).get_json()
    assert (single["priority"], single["queue"], single["max_retries"]) == (20, "mail", jobs[1].max_retries)


def test_a_key_repeated_in_the_call_or_already_taken_gives_the_existing_job(client: Any, deck: Jobdeck) -> None:
    existing = client.post("/api/jobs", json={"type": "demo.noop", "payload": {"o": 1}, "idempotency_key": "o-1"})
    old = existing.get_json()["id"]
    items = [
        {"type": "demo.noop", "payload": {"o": 2}, "idempotency_key": "o-2"},
        {"type": "demo.noop", "payload": {"o": 1}, "idempotency_key": "o-1"},
        {"type": "demo.noop", "payload": {"o": 2}, "idempotency_key": "o-2"},
        {"type": "demo.noop", "payload": {"o": 3}},
    ]
    got = answered(bulk(client, items))
    assert [(j["created"], j["duplicate"]) for j in got] == [
        (True, False),
        (False, False),
        (False, False),
        (True, False),
    ]
    assert got[1]["id"] == old and got[2]["id"] == got[0]["id"]
    assert got[3]["id"] < got[0]["id"], "the jobs without a key go in first, then the keyed ones in key order"
    assert total(deck) == 3
    again = bulk(client, items[:3])
    assert again.status_code == 200, "nothing created: the call was made before"
    assert [j["id"] for j in answered(again)] == [got[0]["id"], old, got[0]["id"]]
    assert total(deck) == 3


@pytest.mark.parametrize("where", ["in-the-call", "already-taken"])
def test_a_key_of_another_payload_refuses_the_call_409_with_its_index(client: Any, deck: Jobdeck, where: str) -> None:
    if where == "already-taken":
        assert client.post("/api/jobs", json={"type": "demo.noop", "idempotency_key": "k"}).status_code == 201
    before = total(deck)
    items = [
        {"type": "demo.noop", "payload": {"n": 1}},
        {"type": "demo.noop", "idempotency_key": "k"},
        {"type": "demo.noop", "payload": {"other": True}, "idempotency_key": "k"},
    ]
    if where == "already-taken":
        items[1] = {"type": "demo.noop", "idempotency_key": "fresh"}
    r = bulk(client, items)
    assert r.status_code == 409
    error = check(r, BULK, "post")
    assert (error["field"], error["index"]) == ("jobs[2].idempotency_key", 2)
    assert error["error"].startswith("jobs[2].idempotency_key: ") and "different payload" in error["error"]
    assert total(deck) == before, "nothing of the call was inserted"


def test_unique_jobs_are_duplicates_in_the_call_and_against_the_kept_job(client: Any, deck: Jobdeck) -> None:
    order = {"by": ["type", "payload.order"]}
    kept = client.post("/api/jobs", json={"type": "demo.noop", "payload": {"order": 1}, "unique": order}).get_json()
    replace = {**order, "on_duplicate": "replace"}
    items = [
        {"type": "demo.noop", "payload": {"order": 2}, "unique": order},
        {"type": "demo.noop", "payload": {"order": 1, "v": 2}, "unique": replace},
        {"type": "demo.noop", "payload": {"order": 2, "v": 2}, "unique": order},
        {"type": "demo.noop", "payload": {"plain": True}},
    ]
    got = answered(bulk(client, items))
    assert [(j["created"], j["duplicate"], j["replaced"]) for j in got] == [
        (True, False, False), (False, True, True), (False, True, False), (True, False, False),
    ]  # fmt: skip
    assert got[1]["id"] == kept["id"] and got[2]["id"] == got[0]["id"]
    assert deck.store.get(kept["id"]).payload == {"order": 1, "v": 2}, "replace applied as singly"
    assert deck.store.get(got[0]["id"]).payload == {"order": 2}, "keep: the later duplicate changed nothing"
    assert total(deck) == 3


def test_the_types_unique_rule_applies_to_each_job(make_deck: Any, clock: Any) -> None:
    deck = make_deck(clock, types={"demo.noop": {"unique": {"by": ["type", "payload.user"]}}})
    client = create_app(deck=deck).test_client()
    got = answered(bulk(client, [{"type": "demo.noop", "payload": {"user": u}} for u in ("a", "b", "a")]))
    assert [j["duplicate"] for j in got] == [False, False, True] and got[2]["id"] == got[0]["id"]
    assert total(deck) == 2
    for kind in ([1], {"a": 1}, None, 7):  # a type of another JSON kind, where a type has a unique rule
        r = bulk(client, [{"type": "demo.send-email", "payload": {"user_id": "u"}}, {"type": kind, "payload": {}}])
        assert r.status_code == 422 and check(r, BULK, "post")["field"] == "jobs[1].type", r.get_json()
    assert total(deck) == 2


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"type": "demo.noop", "priority": "urgent"}, "priority"),
        ({"type": "demo.noop", "payload": [1, 2]}, "payload"),
        ({"type": "demo.nope"}, "type"),
        ({"payload": {}}, "type"),
        ({"type": "demo.noop", "colour": "red"}, "colour"),
        ({"type": "demo.noop", "run_at": "yesterday"}, "run_at"),
        ({"type": "demo.noop", "idempotency_key": "a\u0000b"}, "idempotency_key"),
        ({"type": "demo.noop", "queue": "q\u0000"}, "queue"),
        ({"type": "demo.noop", "unique": True, "idempotency_key": "k"}, "unique"),
    ],
)
def test_an_invalid_job_is_422_naming_its_index_and_field_and_nothing_is_inserted(
    client: Any, deck: Jobdeck, item: dict[str, Any], field: str
) -> None:
    single = client.post("/api/jobs", json=item)
    assert single.status_code == 422 and single.get_json()["field"] == field
    items = [{"type": "demo.noop", "idempotency_key": "first"}, {"type": "demo.noop"}, {"type": "demo.noop"}, item]
    r = bulk(client, items)
    assert r.status_code == 422
    error = check(r, BULK, "post")
    assert (error["field"], error["index"]) == (f"jobs[3].{field}", 3)
    assert error["error"] == f"jobs[3].{single.get_json()['error']}", "the words of the single enqueue"
    assert total(deck) == 0
    assert client.post("/api/jobs", json={"type": "demo.noop", "idempotency_key": "first"}).status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobs": [{"type": "demo.noop"}, 7]}, "jobs[1]"),
        ({"jobs": []}, "jobs"),
        ({"jobs": {"type": "demo.noop"}}, "jobs"),
        ({}, "jobs"),
        ({"jobs": [{"type": "demo.noop"}], "atomic": False}, "atomic"),
    ],
)
def test_the_body_shape_is_checked(client: Any, deck: Jobdeck, body: dict[str, Any], field: str) -> None:
    r = client.post(BULK, json=body)
    assert r.status_code == 422 and check(r, BULK, "post")["field"] == field
    assert total(deck) == 0


def test_a_nul_in_a_payload_is_kept_as_singly(client: Any, deck: Jobdeck) -> None:
    payload = {"text": "a\u0000b", "k\u0000": ["\u0000"]}
    got = answered(bulk(client, [{"type": "demo.noop", "payload": payload}, {"type": "demo.noop"}]))
    assert deck.store.get(got[0]["id"]).payload == payload
    raw = b'{"jobs": [{"type": "demo.noop", "payload": {"s": "x\\u0000y"}, "idempotency_key": "nul"}]}'
    r = client.post(BULK, data=raw, content_type="application/json")
    assert r.status_code == 201 and deck.store.get(answered(r)[0]["id"]).payload == {"s": "x\u0000y"}


def test_caps_the_count_each_payload_and_the_whole_body(make_deck: Any, clock: Any) -> None:
    deck = make_deck(clock, max_bulk_jobs=3, max_payload_bytes=1000, max_bulk_bytes=400_000)
    client = create_app(deck=deck).test_client()
    four = bulk(client, [{"type": "demo.noop"}] * 4)
    assert four.status_code == 422
    assert check(four, BULK, "post")["error"] == "jobs: 1 to 3 jobs in one call (max_bulk_jobs), not 4"

    big = {"type": "demo.noop", "payload": {"s": "x" * 1001}}
    r = bulk(client, [{"type": "demo.noop"}, big])
    assert r.status_code == 413
    error = check(r, BULK, "post")
    assert (error["field"], error["index"]) == ("jobs[1].payload", 1) and "the limit is 1000 bytes" in error["error"]

    # One job's body cap is 3 * 1000 + 64 KiB; the bulk's is max_bulk_bytes.
    at_cap = padded(json.dumps({"jobs": [{"type": "demo.noop", "payload": {"s": "y" * 900}}] * 3}), 400_000)
    assert max_body_bytes(1000) < 400_000
    assert client.post(BULK, data=at_cap, content_type="application/json").status_code == 201
    one = padded(json.dumps({"type": "demo.noop", "payload": {"s": "y" * 900}}), max_body_bytes(1000) + 1)
    r = client.post("/api/jobs", data=one, content_type="application/json")
    assert r.status_code == 413, "the larger cap is the bulk path's alone"
    assert "(max_payload_bytes)" in r.get_json()["error"]

    over = padded(json.dumps({"jobs": [{"type": "demo.noop"}]}), 400_001)
    r = client.post(BULK, data=over, content_type="application/json")
    assert r.status_code == 413
    assert check(r, BULK, "post") == {"error": "request body too large: at most 400000 bytes (max_bulk_bytes)"}
    assert total(deck) == 3


def test_the_bulk_cap_is_never_below_one_enqueues(make_deck: Any, clock: Any) -> None:
    deck = make_deck(clock, max_payload_bytes=100_000, max_bulk_bytes=1000)
    client = create_app(deck=deck).test_client()
    r = bulk(client, [{"type": "demo.noop", "payload": {"s": "z" * 99_000}}])
    assert r.status_code == 201


def test_auth_is_the_single_enqueues(make_deck: Any, clock: Any) -> None:
    deck = make_deck(clock, api_token="s3cret")
    client = create_app(deck=deck).test_client()
    items = [{"type": "demo.noop"}]
    r = bulk(client, items)
    assert r.status_code == 401 and check(r, BULK, "post")["error"] == "missing or invalid bearer token"
    assert bulk(client, items, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert bulk(client, items, headers={"Authorization": "Bearer s3cret"}).status_code == 201
    assert total(deck) == 1


def test_a_cross_site_page_cannot_enqueue_in_bulk(client: Any, deck: Jobdeck) -> None:
    r = client.post(BULK, json={"jobs": [{"type": "demo.noop"}]}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "cross-origin" in check(r, BULK, "post")["error"]
    form = client.post(BULK, data='{"jobs": [{"type": "demo.noop"}]}', content_type="text/plain")
    assert form.status_code == 415
    assert total(deck) == 0


def test_a_thousand_jobs_in_one_call(make_deck: Any, clock: Any) -> None:
    # A stall_timeout of a minute: PostgreSQL's idle_in_transaction_session_timeout
    # follows it (at least 10 s: 10 s at the tests' 5 s), and a test process starved at a
    # low priority beside the full run (CI's quick tier on Python 3.13) sat that
    # long inside the call's transaction; the server ended the session and the
    # call answered 503. What this test checks is the answer and its order.
    deck = make_deck(clock, stall_timeout=60.0)
    client = create_app(deck=deck).test_client()
    items = [{"type": "demo.noop", "payload": {"i": i}} for i in range(1000)]
    items[500] = {**items[500], "idempotency_key": "mid"}
    got = answered(bulk(client, items))
    assert len(got) == 1000 and all(j["created"] for j in got)
    ids = [j["id"] for j in got]
    assert ids[:500] + ids[501:] == sorted(ids)[:999] and ids[500] == max(ids), "the keyed job goes in last"
    assert [deck.store.get(i).payload["i"] for i in ids[::97]] == list(range(0, 1000, 97))
    assert total(deck) == 1000


def nested(levels: int) -> dict[str, Any]:
    """A payload of ``levels`` objects, one inside the other."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_each_job_may_nest_as_deep_as_alone_and_no_deeper(client: Any, deck: Jobdeck) -> None:
    deepest = {"type": "demo.noop", "payload": nested(63)}
    assert client.post("/api/jobs", json=deepest).status_code == 201
    assert bulk(client, [{"type": "demo.noop"}, deepest]).status_code == 201, "the list's two levels are not the job's"
    too_deep = {"type": "demo.noop", "payload": nested(64)}
    alone = client.post("/api/jobs", json=too_deep)
    assert alone.status_code == 422 and "nested deeper than 64 levels" in alone.get_json()["error"]
    r = bulk(client, [{"type": "demo.noop"}, {"type": "demo.noop"}, too_deep])
    assert r.status_code == 422
    error = check(r, BULK, "post")
    assert error["index"] == 2 and error["field"].startswith("jobs[2].payload.a.a")
    assert error["error"].endswith("nested deeper than 64 levels")
    assert total(deck) == 3


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"type": "demo.noop", "payload": {"x": NaN}}', "jobs[1].payload.x"),
        (b'{"type": "demo.noop", "payload": {"x": ["\\ud800"]}}', "jobs[1].payload.x[0]"),
        (b'{"type": "demo.noop", "payload": {"n": 1' + b"0" * 101 + b"}}", "body"),
    ],
)
def test_json_refused_inside_a_job_names_the_job(client: Any, deck: Jobdeck, raw: bytes, field: str) -> None:
    body = b'{"jobs": [{"type": "demo.noop"}, ' + raw + b"]}"
    r = client.post(BULK, data=body, content_type="application/json")
    assert r.status_code == 422
    error = check(r, BULK, "post")
    assert error["field"] == field and error.get("index") == (1 if field != "body" else None)
    assert total(deck) == 0


PLAIN_REFUSED = [
    ({"type": "demo.nope"}, "type"),
    ({"type": 7}, "type"),
    ({"type": "demo.noop", "payload": [1, 2]}, "payload"),
    ({"type": "demo.noop", "payload": {"s": "x" * 2000}}, "payload"),
    ({"type": "demo.noop", "payload": {"k": float("inf")}}, "payload.k"),
]
"""Jobs of the one-pass shape (a type and a payload only) that the single enqueue refuses."""


@pytest.mark.parametrize(("item", "field"), PLAIN_REFUSED)
@pytest.mark.parametrize("first", [True, False], ids=["first-of-its-type", "after-one-of-its-type"])
def test_a_refused_job_among_plain_ones_is_named_by_its_index(
    make_deck: Any, clock: Any, item: dict[str, Any], field: str, first: bool
) -> None:
    """The common shape is checked in one pass (``Jobdeck.enqueue_bulk``): a
    refusal there still names the job, as ``enqueue_each`` names it."""
    deck = make_deck(clock, max_payload_bytes=1000)
    client = create_app(deck=deck).test_client()
    items = [{"type": "demo.noop", "payload": {"n": 1}}, {"type": "demo.send-email", "payload": {"user_id": "u"}}]
    if not first:
        items.append({"type": "demo.noop", "payload": {"n": 3}})
    index = len(items)
    items.append(item)
    with pytest.raises(ItemRefused) as each:
        deck.enqueue_each(items)
    with pytest.raises(ItemRefused) as refused:
        deck.enqueue_bulk(items)
    assert (refused.value.index, refused.value.inner_field, str(refused.value)) == (index, field, str(each.value))
    if field != "payload.k":  # JSON cannot carry inf: the Python call can
        alone = client.post("/api/jobs", json=item)
        r = bulk(client, items)
        assert r.status_code == alone.status_code in (413, 422)
        error = check(r, BULK, "post")
        assert (error["field"], error["index"], error["error"]) == (f"jobs[{index}].{field}", index, str(each.value))
    assert total(deck) == 0, "nothing of the call was inserted"


def test_plain_jobs_are_stored_and_answered_as_enqueue_each_stores_and_answers_them(
    client: Any, deck: Jobdeck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one pass inserts what ``enqueue_each`` would, row for row, and
    answers the same; any other shape still goes through ``enqueue_each``."""
    items = [
        {"type": "demo.noop", "payload": {"n": 1}},
        {"type": "demo.send-email", "payload": {"user_id": "u1", "tags": ["a", "\u00e9"]}},
        {"type": "demo.noop"},
        {"type": "demo.noop", "payload": {}},
        {"type": "demo.noop", "payload": {"nested": {"deep": [1, {"x": None}]}, "n": 2.5}},
    ]
    through_each = [e.job.id for e in deck.enqueue_each(items)]
    in_process = [a.id for a in deck.enqueue_bulk(items)]
    each_calls: list[int] = []
    enqueue_each = deck.enqueue_each

    def counted(jobs: Any) -> Any:
        each_calls.append(len(jobs))
        return enqueue_each(jobs)

    monkeypatch.setattr(deck, "enqueue_each", counted)
    got = answered(bulk(client, items))
    assert each_calls == [], "the common shape takes the one pass"
    assert [(j["created"], j["duplicate"], j["replaced"]) for j in got] == [(True, False, False)] * len(items)
    through_bulk = [j["id"] for j in got]
    assert through_bulk == sorted(through_bulk) and through_bulk[0] > in_process[-1] > through_each[-1]

    def rows(ids: list[int]) -> list[dict[str, Any]]:
        with deck.store.engine.connect() as conn:
            found = {r["id"]: r for r in (dict(m) for m in conn.exec_driver_sql("SELECT * FROM jobs").mappings())}
        return [{k: v for k, v in found[i].items() if k != "id"} for i in ids]

    for a, b in zip(rows(in_process), rows(through_each), strict=True):
        assert a == b, {k: (v, b[k]) for k, v in a.items() if v != b[k]}
    sent = [json.loads(json.dumps(i, sort_keys=True)) for i in items]  # as the test client sends them
    assert rows(through_bulk) == rows([e.job.id for e in enqueue_each(sent)])
    assert answered(bulk(client, [*items[:2], {"type": "demo.noop", "priority": 5}])) and each_calls == [3]


def test_enqueue_bulk_answers_plain_jobs_by_id(deck: Jobdeck) -> None:
    """What ``jobdeck enqueue --file`` prints a line of, for each job."""
    got = deck.enqueue_bulk([{"type": "demo.noop", "payload": {"n": n}} for n in range(3)])
    ids = [a.id for a in got]
    assert ids == sorted(set(ids)) and len(ids) == 3
    assert [a._asdict() for a in got] == [
        {"id": i, "created": True, "duplicate": False, "replaced": False} for i in ids
    ]
    assert [deck.store.get(a.id).payload for a in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
