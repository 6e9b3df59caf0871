"""Bulk enqueue's one-pass validation (``Jobdeck.enqueue_many``) must accept and refuse
exactly what ``Jobdeck.new_job`` does, on both databases."""

from __future__ import annotations

import pytest
from jobdeck.core.errors import InvalidField, PayloadTooLarge, UnknownType

pytestmark = pytest.mark.backends


def test_plain_jobs_get_their_types_defaults_and_payloads(make_deck, registry) -> None:
    registry.handler("t.urgent", max_retries=7, priority=20, queue="fast")(lambda p, c: None)
    deck = make_deck()
    items = [{"type": "t.urgent", "payload": {"i": i, "név": "é"}} for i in range(3)]
    items += [{"type": "demo.noop"}, {"type": "demo.noop", "payload": None}, {"type": "demo.report", "payload": {}}]
    ids = deck.enqueue_many(items)
    got = [deck.store.get(i) for i in ids]
    assert [(j.type, j.queue, j.priority, j.max_retries) for j in got[:3]] == [("t.urgent", "fast", 20, 7)] * 3
    assert [j.payload for j in got[:3]] == [{"i": i, "név": "é"} for i in range(3)]
    assert [(j.type, j.queue, j.payload) for j in got[3:]] == [
        ("demo.noop", "default", {}), ("demo.noop", "default", {}), ("demo.report", "reports", {}),
    ]  # fmt: skip
    assert all(j.max_retries == deck.config.default_max_retries for j in got[3:])


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        ({"type": "no.such"}, UnknownType, None),
        ({"type": "demo.noop", "payload": [1]}, InvalidField, "payload"),
        ({"type": "demo.noop", "payload": 0}, InvalidField, "payload"),
        ({"type": "demo.noop", "payload": {"x": {1, 2}}}, InvalidField, "payload"),
        ({"type": ""}, InvalidField, "type"),
        ({"type": "demo.noop", "colour": "red"}, InvalidField, "colour"),
        ("not an object", InvalidField, "body"),
    ],
)
def test_one_bad_item_refuses_the_whole_batch_with_new_jobs_error(deck, bad, error, field) -> None:
    good = [{"type": "demo.noop", "payload": {"i": i}} for i in range(3)]
    with pytest.raises(error) as refused:
        deck.enqueue_many([*good, bad, *good])
    if field is not None:
        assert refused.value.field == field  # type: ignore[attr-defined]
    assert deck.store.counts(deck.clock())["pending"] == 0


def test_the_payload_limit_counts_bytes_not_characters(make_deck) -> None:
    deck = make_deck(max_payload_bytes=1000)
    fits = {"s": "é" * 480}  # 960 bytes of text, under 1,000 with the JSON around it
    assert len(deck.enqueue_many([{"type": "demo.noop"}, {"type": "demo.noop", "payload": fits}])) == 2
    with pytest.raises(PayloadTooLarge):
        deck.enqueue_many([{"type": "demo.noop"}, {"type": "demo.noop", "payload": {"s": "é" * 600}}])


def test_items_with_more_than_type_and_payload_take_the_full_path(deck) -> None:
    ids = deck.enqueue_many([{"type": "demo.noop"}, {"type": "demo.noop", "priority": "high", "idempotency_key": "k1"}])
    again = deck.enqueue_many([{"type": "demo.noop", "idempotency_key": "k1"}])
    assert again == [ids[1]] and deck.store.get(ids[1]).priority == 20
