"""Hostile flow keys (``jobdeck.jobs.flow.encode_key``): whatever the payload holds
under a key path (NUL bytes, very long strings, nested objects, numbers that
look like strings, deep nesting), the enqueue answers 201, the key is stored
bounded and NUL-free on both databases, and each distinct value is its own
key: a concurrency of one per key claims exactly one job of each."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.jobs.flow import MAX_KEY_CHARS, encode_key
from jobdeck.store.models import jobs
from sqlalchemy import select

pytestmark = pytest.mark.backends

VALUES: list[Any] = [
    "a\x00b",
    "a\x00c",
    "\x00",
    "x" * 60_000,
    "x" * 60_001,
    {"b": 1, "a": [1, 2, {"c": None}]},
    {"a": [1, 2, {"c": None}], "b": 1},  # the same object in another order: the same key
    7,
    "7",
    7.5,
    True,
    "true",
    2**70,
    [],
    "",
    "🙂" * 300,
    {"deep": {"deeper": {"deepest": ["\x00"] * 3}}},
]
DISTINCT = len(VALUES) - 1


def test_hostile_keys_are_stored_bounded_and_each_is_its_own_key(make_deck):
    deck = make_deck(types={"demo.sleep": {"concurrency": 1, "concurrency_key": "payload.who"}})
    client = create_app(deck=deck).test_client()
    for value in [*VALUES, *VALUES]:
        response = client.post("/api/jobs", data=json.dumps({"type": "demo.sleep", "payload": {"who": value}}),
                               content_type="application/json")  # fmt: skip
        assert response.status_code == 201, response.get_data(as_text=True)[:300]
    with deck.store.read() as conn:
        keys = list(conn.execute(select(jobs.c.concurrency_key)).scalars())
    assert all(k is not None and len(k) <= MAX_KEY_CHARS + 7 and "\x00" not in k for k in keys)
    assert len(set(keys)) == DISTINCT
    claimed = deck.store.claim("w", deck.clock(), limit=100)
    assert len(claimed) == DISTINCT
    assert deck.store.claim("w", deck.clock(), limit=100) == []
    body = client.get("/api/queues").get_json()
    assert body["limits"][0]["concurrency_per_key"]["keys_at_limit"] == DISTINCT


def test_a_key_path_through_non_objects_is_the_null_bucket():
    assert encode_key({"a": "text"}, "payload.a.b") == "null"
    assert encode_key({"a": [{"b": 1}]}, "payload.a.b") == "null"
    assert encode_key(None, "payload.a") == "null"
    assert encode_key({"a": {"b": "x"}}, "payload.a.b") == '"x"'
