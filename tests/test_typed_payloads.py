"""Typed payloads: a handler annotated with a dataclass, a TypedDict or a
pydantic model gets its payload converted, and every enqueue of its type
(the handle, ``deck.enqueue``, the bulk calls, the HTTP API) checks the
same shape, so a bad payload is refused at enqueue naming the field, not a
dead job later. Real pools on both databases."""

from __future__ import annotations

import asyncio
import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, NotRequired, TypedDict

import pytest
from jobdeck import create_app
from jobdeck.core.errors import InvalidField, ItemRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.store.records import JobFilter

from tests.conftest import Clock, all_in, wait_for

try:
    import pydantic
except ImportError:  # optional: Jobdeck never depends on it
    pydantic = None  # type: ignore[assignment]

pytestmark = pytest.mark.backends

WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Line:
    sku: str
    qty: int = 1


@dataclass
class Order:
    order_id: int
    lines: list[Line]
    when: datetime
    colour: Colour = Colour.RED
    note: str | None = None
    tags: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.order_id <= 0:
            raise ValueError("order_id must be positive")


class Mail(TypedDict):
    to: str
    cc: NotRequired[list[str]]


if pydantic is not None:

    class Invoice(pydantic.BaseModel):
        number: int
        lines: list[int]


ORDER = {"order_id": 7, "lines": [{"sku": "a"}, {"sku": "b", "qty": 2}], "when": WHEN.isoformat(), "colour": "blue"}


def _run(deck: Jobdeck, job_ids: list[int]) -> None:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        ended = (State.COMPLETED, State.DEAD)
        wait_for(lambda: all_in(deck, job_ids, ended), message="every job to end")
    finally:
        pool.stop(grace=5)


@pytest.mark.parametrize("is_async", [False, True], ids=["thread", "async"])
def test_a_typed_handler_gets_its_payload_converted(
    make_deck: Callable[..., Jobdeck], registry: Registry, is_async: bool
) -> None:
    got: list[Order] = []

    def body(payload: Order, ctx: JobContext) -> dict[str, Any]:
        got.append(payload)
        return {"lines": len(payload.lines)}

    if is_async:

        async def fulfil(payload: Order, ctx: JobContext) -> dict[str, Any]:
            await asyncio.sleep(0)
            return body(payload, ctx)

        handle = registry.handler("shop.fulfil")(fulfil)
    else:
        handle = registry.handler("shop.fulfil")(body)
    assert registry.get("shop.fulfil").is_async is is_async

    deck = make_deck()
    typed = Order(8, [Line("c", 3)], WHEN, Colour.RED, tags={"gift"})
    ids = [
        deck.enqueue("shop.fulfil", ORDER).job.id,
        handle.enqueue(typed, deck=deck).job.id,
        handle.enqueue(**ORDER, deck=deck).job.id,
    ]
    assert deck.store.get(ids[1]).payload == {
        "order_id": 8, "lines": [{"sku": "c", "qty": 3}], "when": WHEN.isoformat(), "colour": "red",
        "note": None, "tags": ["gift"],
    }, "an instance is stored in its JSON form"  # fmt: skip
    _run(deck, ids)

    assert [deck.store.get(i).status for i in ids] == [State.COMPLETED] * 3
    first = next(o for o in got if o.order_id == 7)
    assert first == Order(7, [Line("a", 1), Line("b", 2)], WHEN, Colour.BLUE)
    assert next(o for o in got if o.order_id == 8) == typed


def test_a_bad_payload_is_refused_at_every_enqueue_naming_the_field(
    make_deck: Callable[..., Jobdeck], registry: Registry, clock: Clock
) -> None:
    @registry.handler("shop.fulfil")
    def fulfil(payload: Order, ctx: JobContext) -> None:
        return None

    deck = make_deck(clock=clock)
    bad = {
        "payload.lines": {**ORDER, "lines": None},
        "payload.lines[1].qty": {**ORDER, "lines": [{"sku": "a"}, {"sku": "b", "qty": "2"}]},
        "payload.lines[0].sku": {**ORDER, "lines": [{"qty": 1}]},
        "payload.when": {**ORDER, "when": "yesterday"},
        "payload.colour": {**ORDER, "colour": "green"},
        "payload.colour2": {**ORDER, "colour2": "red"},
        "payload": {**ORDER, "order_id": -1},
    }
    for where, payload in bad.items():
        with pytest.raises(InvalidField) as refused:
            deck.enqueue("shop.fulfil", payload)
        assert refused.value.field == where, str(refused.value)
        with pytest.raises(InvalidField) as through_handle:
            fulfil.enqueue(payload, deck=deck)
        assert str(through_handle.value) == str(refused.value)
    with pytest.raises(InvalidField, match=r"^payload\.lines\[1\]\.qty: must be an integer, not a string$"):
        fulfil.enqueue(**bad["payload.lines[1].qty"], deck=deck)
    with pytest.raises(InvalidField, match=r"^payload\.order_id: required$"):
        fulfil.enqueue(deck=deck)
    changed = Order(1, [], WHEN)
    changed.order_id = -1  # after __post_init__: the enqueue checks it again
    with pytest.raises(InvalidField, match="^payload: order_id must be positive$"):
        fulfil.enqueue(changed, deck=deck)

    with pytest.raises(ItemRefused, match=r"^jobs\[1\]\.payload\.when: must be an ISO 8601"):
        deck.enqueue_each(
            [{"type": "shop.fulfil", "payload": ORDER}, {"type": "shop.fulfil", "payload": bad["payload.when"]}]
        )
    with pytest.raises(InvalidField, match=r"^payload\.colour: must be one of 'red', 'blue'$"):
        deck.enqueue_many(
            [{"type": "shop.fulfil", "payload": ORDER}, {"type": "shop.fulfil", "payload": bad["payload.colour"]}]
        )
    client = create_app(deck=deck).test_client()
    answer = client.post("/api/jobs", json={"type": "shop.fulfil", "payload": bad["payload.lines[0].sku"]})
    assert answer.status_code == 422 and answer.get_json()["field"] == "payload.lines[0].sku", answer.get_json()
    assert deck.store.list_jobs(JobFilter(limit=100), clock.now) == [], "nothing refused was stored"

    assert len(deck.enqueue_many([{"type": "shop.fulfil", "payload": ORDER}] * 3)) == 3, "the bulk path still runs"


def test_a_stored_payload_that_no_longer_fits_fails_without_a_retry(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    """A job enqueued before its handler was typed (or edited since) cannot
    succeed on a retry: its attempt fails, naming the field."""
    registry.handler("shop.fulfil")(lambda payload, ctx: None)
    deck = make_deck()
    job = deck.enqueue("shop.fulfil", {"order_id": 1}, max_retries=3).job

    @registry.handler("shop.fulfil")
    def fulfil(payload: Order, ctx: JobContext) -> None:
        raise AssertionError("never called with a payload that does not fit")

    _run(deck, [job.id])
    done = deck.store.get(job.id)
    assert (done.status, done.retry_count) == (State.DEAD, 0)
    assert (done.error or "").startswith("InvalidField: payload.lines: required"), done.error


def test_a_typeddict_is_checked_and_stays_a_dict(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    got: list[Any] = []

    @registry.handler("mail.send")
    def send(payload: Mail, ctx: JobContext) -> None:
        got.append(payload)

    deck = make_deck()
    with pytest.raises(InvalidField, match=r"^payload\.cc\[1\]: must be a string, not an integer$"):
        send.enqueue(to="a@example.test", cc=["b@example.test", 3], deck=deck)
    with pytest.raises(InvalidField, match=r"^payload\.to: required$"):
        send.enqueue(cc=[], deck=deck)
    ids = [send.enqueue(to="a@example.test", deck=deck).job.id, send.enqueue(to="b", cc=["c"], deck=deck).job.id]
    _run(deck, ids)
    assert sorted(got, key=lambda m: m["to"]) == [{"to": "a@example.test"}, {"to": "b", "cc": ["c"]}]
    assert send({"to": "direct"}, None) is None and got[-1] == {"to": "direct"}, "a TypedDict payload is passed as is"


@pytest.mark.skipif(pydantic is None, reason="pydantic is optional and not installed")
def test_a_pydantic_model_is_validated_by_pydantic(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    got: list[Any] = []

    @registry.handler("billing.invoice")
    def invoice(payload: Invoice, ctx: JobContext) -> int:
        got.append(payload)
        return payload.number

    deck = make_deck()
    with pytest.raises(InvalidField) as refused:
        invoice.enqueue(number=1, lines=[1, "x"], deck=deck)
    assert refused.value.field == "payload.lines[1]" and "integer" in str(refused.value)
    job = invoice.enqueue(Invoice(number=5, lines=[1, 2]), deck=deck).job
    assert job.payload == {"number": 5, "lines": [1, 2]}
    _run(deck, [job.id])
    assert deck.store.get(job.id).result == 5 and got == [Invoice(number=5, lines=[1, 2])]


def test_calling_the_handle_with_a_mapping_converts_it_and_bad_shapes_stop_registration(registry: Registry) -> None:
    @registry.handler("shop.fulfil")
    def fulfil(payload: Order, ctx: Any) -> Order:
        return payload

    assert fulfil(ORDER, None) == Order(7, [Line("a"), Line("b", 2)], WHEN, Colour.BLUE), "as a job's payload"
    typed = Order(9, [], WHEN)
    assert fulfil(typed, None) is typed, "an instance is passed as it is"
    assert registry.get("shop.fulfil").payload_shape.cls is Order

    @dataclass
    class Broken:
        ref: Missing  # type: ignore[name-defined]  # noqa: F821

    def broken(payload: Broken, ctx: Any) -> None:
        return None

    broken.__annotations__["payload"] = Broken  # resolved, but its own field does not resolve
    with pytest.raises(ValueError, match="^t.broken: payload type .*Broken: its annotations do not resolve"):
        registry.handler("t.broken")(broken)

    @registry.handler("t.plain")
    def plain(payload: dict[str, Any], ctx: Any) -> None:
        return None

    assert registry.get("t.plain").payload_shape is None and registry.get("t.plain").fn is plain.__wrapped__


def test_the_openapi_document_shows_each_typed_payload(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    import jsonschema

    registry.handler("shop.fulfil")(lambda payload, ctx: None)  # replaced below: only typed ones are shown
    registry.handler("shop.fulfil")(_typed_fulfil)
    registry.handler("mail.send")(_typed_send)
    if pydantic is not None:
        registry.handler("billing.invoice")(_typed_invoice)
    deck = make_deck()
    doc = create_app(deck=deck).test_client().get("/api/openapi.json").get_json()

    components = doc["components"]["schemas"]
    shown = components["NewJob"]["properties"]["payload"]["x-payload-schemas"]
    typed = {"shop.fulfil", "mail.send", *({"billing.invoice"} if pydantic is not None else ())}
    assert set(shown) == typed, "untyped types (the demo's) are not listed"
    order = components["Payload.shop.fulfil"]
    assert order["required"] == ["order_id", "lines", "when"] and order["additionalProperties"] is False
    assert order["properties"]["lines"]["items"]["required"] == ["sku"]
    assert components["Payload.mail.send"]["required"] == ["to"]

    def fits(job_type: str, payload: dict[str, Any]) -> bool:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": {"schemas": components},
                  **shown[job_type]}  # fmt: skip
        return jsonschema.Draft202012Validator(schema).is_valid(payload)

    assert fits("shop.fulfil", ORDER) and not fits("shop.fulfil", {**ORDER, "lines": [{"qty": 1}]})
    assert fits("mail.send", {"to": "a"}) and not fits("mail.send", {"to": "a", "bcc": "b"})
    if pydantic is not None:
        assert fits("billing.invoice", {"number": 1, "lines": [2]}) and not fits("billing.invoice", {"number": "x"})


def _typed_fulfil(payload: Order, ctx: JobContext) -> None:
    return None


def _typed_send(payload: Mail, ctx: JobContext) -> None:
    return None


def _typed_invoice(payload: Invoice, ctx: JobContext) -> None:
    return None


def _typed_process(payload: Order, ctx: JobContext) -> dict[str, Any]:
    """Run by the process executor: imported by name in its child."""
    return {"kind": type(payload).__name__, "skus": [line.sku for line in payload.lines], "pid": os.getpid()}


@pytest.mark.slow  # starts a child interpreter: left out of the quick tier
def test_a_typed_handler_in_a_child_process_gets_its_payload_converted(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    registry.handler("shop.isolated", executor="process", max_retries=0)(_typed_process)
    deck = make_deck(process_workers=1)
    job = deck.enqueue("shop.isolated", ORDER).job
    _run(deck, [job.id])
    done = deck.store.get(job.id)
    assert done.status is State.COMPLETED, done.error
    assert done.result["kind"] == "Order" and done.result["skus"] == ["a", "b"] and done.result["pid"] != os.getpid()


def test_an_edit_of_a_typed_payload_is_checked_like_an_enqueue(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    registry.handler("shop.fulfil")(_typed_fulfil)
    deck = make_deck()
    job = deck.enqueue("shop.fulfil", ORDER, delay_seconds=3600).job
    with pytest.raises(InvalidField, match=r"^payload\.lines\[0\]\.qty: must be an integer, not a string$"):
        deck.edit(job.id, {"payload": {**ORDER, "lines": [{"sku": "a", "qty": "9"}]}})
    client = create_app(deck=deck).test_client()
    refused = client.patch(f"/api/jobs/{job.id}", json={"payload": {**ORDER, "when": "soon"}})
    assert refused.status_code == 422 and refused.get_json()["field"] == "payload.when", refused.get_json()
    assert deck.store.get(job.id).payload == ORDER, "a refused edit changed nothing"

    edited = client.patch(f"/api/jobs/{job.id}", json={"payload": {**ORDER, "order_id": 70}, "priority": 5})
    assert edited.status_code == 200, edited.get_json()
    assert deck.edit(job.id, {"priority": 6}).after.priority == 6, "an edit without a payload reads no shape"
    assert deck.store.get(job.id).payload["order_id"] == 70


@dataclass
class Stock:
    by_shelf: dict[int, int]
    by_colour: dict[Colour, list[int]]
    by_day: dict[date, str] = field(default_factory=dict)


def _typed_stock(payload: Stock, ctx: JobContext) -> dict[str, Any]:
    assert payload == Stock({3: 1, -2: 5}, {Colour.RED: [1]}, {date(2026, 3, 4): "in"}), payload
    return {"shelves": sorted(payload.by_shelf)}


def test_a_dict_with_typed_keys_round_trips(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    """JSON object keys are text: a dict keyed by int, an Enum or a date is
    stored with its keys as text and given back to the handler as typed keys."""
    handle = registry.handler("shop.stock")(_typed_stock)
    deck = make_deck()
    typed = Stock({3: 1, -2: 5}, {Colour.RED: [1]}, {date(2026, 3, 4): "in"})
    job = handle.enqueue(typed, deck=deck).job
    assert job.payload == {"by_shelf": {"3": 1, "-2": 5}, "by_colour": {"red": [1]}, "by_day": {"2026-03-04": "in"}}
    for key, where in (("x", "by_shelf"), ("3.0", "by_shelf"), ("--3", "by_shelf"), ("green", "by_colour")):
        bad = {**job.payload, where: {key: 1 if where == "by_shelf" else [1]}}
        with pytest.raises(InvalidField, match=rf"^payload\.{where}\.{re.escape(key)}: "):
            deck.enqueue("shop.stock", bad)
    _run(deck, [job.id])
    done = deck.store.get(job.id)
    assert (done.status, done.result) == (State.COMPLETED, {"shelves": [-2, 3]}), done.error
