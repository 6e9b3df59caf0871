"""Hostile ``unique`` options and key values (``jobdeck.jobs.unique``): each is a 422
naming the field, or a key that is stored and still decides correctly; none
is a 500. On SQLite and PostgreSQL (where a NUL in text is a DataError)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobdeck.core.validation import MAX_JSON_DEPTH
from jobdeck.deck import Jobdeck
from jobdeck.jobs.unique import MAX_READABLE_KEY

pytestmark = pytest.mark.backends

JOBS = "/api/jobs"


def send(client: Any, body: Any) -> Any:
    return client.post(JOBS, data=json.dumps(body), content_type="application/json")


def refused(response: Any, field: str | None = None) -> str:
    assert response.status_code == 422, (response.status_code, response.get_data(as_text=True)[:500])
    data = response.get_json()
    assert isinstance(data["error"], str) and data["error"]
    if field is not None:
        assert str(data.get("field", "")).startswith(field), data
    return str(data["error"])


def job(unique: Any, payload: Any = None) -> dict[str, Any]:
    return {"type": "demo.noop", "payload": {"order_id": 1} if payload is None else payload, "unique": unique}


@pytest.mark.parametrize(
    ("unique", "field"),
    [
        ("yes", "unique"),
        (1, "unique"),
        ([], "unique"),
        ({"colour": "red"}, "unique.colour"),
        ({"\x00": 1}, "unique."),
        ({"by": []}, "unique.by"),
        ({"by": "payload.order_id"}, "unique.by"),
        ({"by": [1]}, "unique.by"),
        ({"by": [None]}, "unique.by"),
        ({"by": ["payload."]}, "unique.by"),
        ({"by": ["payload..x"]}, "unique.by"),
        ({"by": ["payload.a\x00b"]}, "unique.by"),
        ({"by": ["payload.a b"]}, "unique.by"),
        ({"by": ["payload." + "a" * 65]}, "unique.by"),
        ({"by": ["payload." + ".".join("a" * 9)]}, "unique.by"),
        ({"by": ["payload_order_id"]}, "unique.by"),
        ({"by": ["id"]}, "unique.by"),
        ({"by": ["../etc/passwd"]}, "unique.by"),
        ({"by": ["type", "type"]}, "unique.by"),
        ({"by": [f"payload.f{i}" for i in range(11)]}, "unique.by"),
        ({"period": 0}, "unique.period"),
        ({"period": -5}, "unique.period"),
        ({"period": True}, "unique.period"),
        ({"period": "3600"}, "unique.period"),
        ({"period": 1e300}, "unique.period"),
        ({"debounce": -1}, "unique.debounce"),
        ({"debounce": 30, "states": ["pending"]}, "unique.debounce"),
        ({"states": []}, "unique.states"),
        ({"states": "pending"}, "unique.states"),
        ({"states": ["pending\x00"]}, "unique.states"),
        ({"states": ["PENDING"]}, "unique.states"),
        ({"states": [["pending"]]}, "unique.states"),
        ({"on_duplicate": "merge"}, "unique.on_duplicate"),
        ({"on_duplicate": None}, "unique.on_duplicate"),
        ({"on_duplicate": "replace", "states": ["running"]}, "unique.on_duplicate"),
    ],
)
def test_bad_options_are_a_422_naming_the_option(client: Any, deck: Jobdeck, unique: Any, field: str) -> None:
    refused(send(client, job(unique)), field)
    assert sum(deck.store.counts(deck.clock()).values()) == 0


@pytest.mark.parametrize(
    "value",
    [{"nested": 1}, [1, 2], [], {}],
)
def test_a_key_field_that_is_not_a_scalar_is_refused(client: Any, value: Any) -> None:
    message = refused(send(client, job({"by": ["payload.order_id"]}, {"order_id": value})), "unique")
    assert "payload.order_id" in message


def test_a_key_field_the_payload_lacks_is_refused(client: Any) -> None:
    assert "lacks" in refused(send(client, job({"by": ["payload.order_id"]}, {"other": 1})), "unique")
    assert "lacks" in refused(send(client, job({"by": ["payload.a.b"]}, {"a": 5})), "unique")


def test_deep_json_in_unique_is_refused_before_anything(client: Any) -> None:
    deep: Any = "x"
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = {"by": deep}
    refused(send(client, job(deep)))


def test_nul_bytes_and_huge_values_make_stored_keys_that_still_decide(client: Any, deck: Jobdeck) -> None:
    unique = {"by": ["payload.v"]}
    for value in ["a\x00b", "x" * 60000, "é\u2028\U0001f600"]:
        made = send(client, job(unique, {"v": value}))
        assert made.status_code == 201, made.get_data(as_text=True)[:300]
        key = made.get_json()["unique_key"]
        assert key is not None and len(key) <= 255 and "\x00" not in key
        if len(value) > MAX_READABLE_KEY:
            assert key.startswith("sha256:")
        again = send(client, job(unique, {"v": value}))
        assert again.status_code == 200 and again.get_json()["id"] == made.get_json()["id"]
    assert send(client, job(unique, {"v": "a\x00c"})).status_code == 201, "a different value after the NUL"


def test_values_that_would_collide_if_concatenated_get_different_keys(deck: Jobdeck) -> None:
    by = {"by": ["payload.a", "payload.b"]}
    one = deck.enqueue("demo.noop", {"a": 'x","payload.b":"y', "b": "z"}, unique=by)
    two = deck.enqueue("demo.noop", {"a": "x", "b": 'y","payload.b":"z'}, unique=by)
    three = deck.enqueue("demo.noop", {"a": 1, "b": True}, unique=by)
    four = deck.enqueue("demo.noop", {"a": True, "b": 1}, unique=by)
    five = deck.enqueue("demo.noop", {"a": "1", "b": True}, unique=by)
    ids = {r.job.id for r in (one, two, three, four, five)}
    assert len(ids) == 5 and all(r.created for r in (one, two, three, four, five))


def test_a_list_body_is_refused(client: Any) -> None:
    refused(send(client, [job(True), job(True)]), "body")


def test_bulk_enqueue_checks_unique_like_a_single_enqueue(deck: Jobdeck) -> None:
    from jobdeck.core.errors import InvalidField

    good = {"type": "demo.noop", "payload": {"order_id": 1}, "unique": True}
    with pytest.raises(InvalidField) as bad:
        deck.enqueue_many(
            [good, {"type": "demo.noop", "payload": {"order_id": [1]}, "unique": {"by": ["payload.order_id"]}}]
        )
    assert bad.value.field == "unique"
    assert sum(deck.store.counts(deck.clock()).values()) == 0, "one bad item refuses the whole batch"
