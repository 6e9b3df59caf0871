"""Hostile payloads against typed handlers: what the shape's own code does
(a ``__post_init__`` that asserts, a float field given an integer too big
for a float, a value that holds itself, a pydantic model with aliases) is a
refusal naming the place, at every way in, never an exception a caller did
not ask for or a 500; and a typed batch callback is checked with the
``batch`` its payload will carry, instead of dying when the batch fires."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.errors import InvalidField, ItemRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.testing import HandlerTest

try:
    import pydantic
except ImportError:  # optional: Jobdeck never depends on it
    pydantic = None  # type: ignore[assignment]

if pydantic is not None:

    class AliasedOrder(pydantic.BaseModel):
        order_id: int = pydantic.Field(alias="orderId")
        note: str | None = None

    class Connection:
        """A type pydantic holds (``arbitrary_types_allowed``) and cannot describe in a JSON Schema."""

    class WithConnection(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        connection: Connection | None = None
        n: int

    class Guarded(pydantic.BaseModel):
        amount: int

        @pydantic.model_validator(mode="after")
        def _positive(self) -> Guarded:
            if self.amount <= 0:
                raise RuntimeError("amount must be positive")  # not a ValueError: pydantic lets it through
            return self


@dataclass
class Checked:
    amount: int

    def __post_init__(self) -> None:
        if self.amount <= 0:  # as an ``assert`` would, without the test runner's rewriting of it
            raise AssertionError("amount must be positive")
        if self.amount > 100:
            raise KeyError("no such amount")


@dataclass
class Price:
    value: float


@dataclass
class Node:
    name: str
    children: list[Node] = field(default_factory=list)


def _checked(payload: Checked, ctx: JobContext) -> int:
    return payload.amount


def _price(payload: Price, ctx: JobContext) -> float:
    return payload.value


def _node(payload: Node, ctx: JobContext) -> str:
    return payload.name


def test_a_post_init_that_raises_anything_refuses_the_payload(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    handle = registry.handler("t.checked")(_checked)
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    for amount, message in ((-1, "AssertionError: amount must be positive"), (101, "KeyError: 'no such amount'")):
        with pytest.raises(InvalidField) as refused:
            deck.enqueue("t.checked", {"amount": amount})
        assert (refused.value.field, str(refused.value)) == ("payload", f"payload: {message}")
        with pytest.raises(InvalidField):
            handle.enqueue(amount=amount, deck=deck)
        answer = client.post("/api/jobs", json={"type": "t.checked", "payload": {"amount": amount}})
        assert answer.status_code == 422 and answer.get_json()["field"] == "payload", answer.get_data(as_text=True)
    job = deck.enqueue("t.checked", {"amount": 5}, delay_seconds=60).job
    edit = client.patch(f"/api/jobs/{job.id}", json={"payload": {"amount": 0}})
    assert edit.status_code == 422 and "AssertionError" in edit.get_json()["error"]
    assert deck.store.get(job.id).payload == {"amount": 5}


def test_an_integer_too_big_for_a_float_field_is_refused(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    handle = registry.handler("t.price")(_price)
    deck = make_deck()
    huge = 10**400  # fits a JSON payload (fewer digits than Python's limit), not a float
    with pytest.raises(InvalidField, match=r"^payload\.value: must be a number a float can hold"):
        deck.enqueue("t.price", {"value": huge})
    with pytest.raises(InvalidField, match=r"^payload\.value: "):
        handle.enqueue(value=huge, deck=deck)
    with pytest.raises(ItemRefused, match=r"^jobs\[1\]\.payload\.value: "):
        deck.enqueue_each(
            [{"type": "t.price", "payload": {"value": 1}}, {"type": "t.price", "payload": {"value": huge}}]
        )
    assert deck.enqueue("t.price", {"value": 10**300}).job.payload == {"value": 10**300}, "a big one that fits"


def test_a_value_that_holds_itself_or_nests_too_deep_is_refused(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    handle = registry.handler("t.node")(_node)
    untyped = registry.handler("t.untyped")(lambda payload, ctx: None)
    deck = make_deck()
    looped: dict[str, Any] = {"name": "a"}
    looped["children"] = [looped]
    with pytest.raises(InvalidField, match="^payload"):
        untyped.enqueue(looped, deck=deck)
    with pytest.raises(InvalidField, match="^payload"):
        handle.enqueue(looped, deck=deck)
    node = Node("a")
    node.children.append(node)
    with pytest.raises(InvalidField, match="^payload"):
        handle.enqueue(node, deck=deck)

    deep: dict[str, Any] = {"name": "leaf"}
    for _ in range(2000):
        deep = {"name": "n", "children": [deep]}
    job = deck.enqueue("t.node", {"name": "root"}, delay_seconds=60).job
    with pytest.raises(InvalidField, match="nested deeper than"):
        deck.edit(job.id, {"payload": deep})
    with pytest.raises(InvalidField, match="nested deeper than"):
        deck.enqueue("t.node", deep)
    assert deck.store.get(job.id).payload == {"name": "root"}


@pytest.mark.skipif(pydantic is None, reason="pydantic is optional and not installed")
def test_a_pydantic_model_with_aliases_is_enqueued_from_an_instance() -> None:
    reg = Registry()

    @reg.handler("shop.order")
    def order(payload: AliasedOrder, ctx: JobContext) -> int:
        return payload.order_id

    with HandlerTest(reg) as jobs:
        run = jobs.run(order, AliasedOrder(orderId=7))
        assert run.job.payload == {"orderId": 7, "note": None}, "stored as the model reads it back"
        assert (run.status, run.result) == (State.COMPLETED, 7)


@dataclass
class BatchFigures:
    id: int
    name: str | None
    counts: dict[str, int]
    job_ids: list[int]
    callback: str
    more_job_ids: int = 0


@dataclass
class Notify:
    channel: str
    batch: BatchFigures


@dataclass
class NotifyWithoutBatch:
    channel: str


def test_a_typed_batch_callback_is_checked_with_the_batch_it_will_carry() -> None:
    reg = Registry()
    reg.handler("t.work")(lambda payload, ctx: "done")

    @reg.handler("t.notify", max_retries=0)
    def notify(payload: Notify, ctx: JobContext) -> dict[str, Any]:
        return {"channel": payload.channel, "batch": payload.batch.name, "counts": payload.batch.counts}

    @reg.handler("t.blind", max_retries=0)
    def blind(payload: NotifyWithoutBatch, ctx: JobContext) -> None:
        return None

    with HandlerTest(reg) as jobs:
        with pytest.raises(InvalidField) as refused:
            jobs.deck.batch(on_complete={"type": "t.blind", "payload": {"channel": "#ops"}})
        assert refused.value.field == "on_complete.payload.batch", str(refused.value)
        with pytest.raises(InvalidField, match=r"^on_success\.payload\.channel: required"):
            jobs.deck.batch(on_success="t.notify")

        with jobs.deck.batch(name="nightly", on_success={"type": "t.notify", "payload": {"channel": "#ops"}}) as batch:
            work = batch.add("t.work")
        assert jobs.wait(work).status is State.COMPLETED
        fired = _wait_fired(jobs, batch.id)
        callback = jobs.wait(fired["callbacks"]["on_success"])
        assert callback.status is State.COMPLETED, callback.error
        assert callback.result == {"channel": "#ops", "batch": "nightly", "counts": {"completed": 1}}
        assert "batch" not in json.loads(json.dumps(jobs.deck.store.batch(batch.id).callbacks["on_success"]["payload"]))


def _wait_fired(jobs: HandlerTest, batch_id: int) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 10
    while (record := jobs.deck.store.batch(batch_id)).fired_at is None:
        assert time.monotonic() < deadline, "the batch never fired"
        time.sleep(0.01)
    return dict(record.outcome)


@dataclass
class Labels:
    by_name: dict[str, Any]


def _labels(payload: Labels, ctx: JobContext) -> None:
    return None


def test_a_key_json_cannot_hold_is_refused_from_an_instance(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    handle = registry.handler("t.labels")(_labels)
    deck = make_deck()
    for keys in ({(1, 2): "pair"}, {None: "none"}, {1.5: "float"}):
        with pytest.raises(InvalidField, match=r"^payload\.by_name"):
            handle.enqueue(Labels(keys), deck=deck)
        with pytest.raises(InvalidField, match=r"^payload\.by_name"):
            handle.enqueue(by_name=keys, deck=deck)


@pytest.mark.skipif(pydantic is None, reason="pydantic is optional and not installed")
def test_a_pydantic_validator_that_raises_anything_refuses_the_payload(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    def guarded(payload: Guarded, ctx: JobContext) -> int:
        return payload.amount

    registry.handler("t.guarded")(guarded)
    deck = make_deck()
    with pytest.raises(InvalidField, match=r"^payload: RuntimeError: amount must be positive$"):
        deck.enqueue("t.guarded", {"amount": 0})
    answer = create_app(deck=deck).test_client().post("/api/jobs", json={"type": "t.guarded", "payload": {"amount": 0}})
    assert answer.status_code == 422 and answer.get_json()["field"] == "payload", answer.get_data(as_text=True)


def test_a_huge_key_is_named_cut_short(make_deck: Callable[..., Jobdeck], registry: Registry) -> None:
    """A refusal names the field; a payload's own key can be as long as the
    payload, and the name is echoed in the answer, twice, and in the page."""
    registry.handler("t.labels")(_labels)
    registry.handler("t.price")(_price)
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    key = "k" * 50_000
    for body in ({"type": "t.price", "payload": {key: 1}}, {"type": "t.labels", "payload": {"by_name": {}, key: 1}}):
        answer = client.post("/api/jobs", json=body)
        assert answer.status_code == 422
        refusal = answer.get_json()
        assert len(refusal["field"]) <= 81 and len(refusal["error"]) < 500, refusal["field"][:100]
        assert refusal["field"].startswith("payload.kkk") and refusal["field"].endswith("…")


@pytest.mark.skipif(pydantic is None, reason="pydantic is optional and not installed")
def test_a_pydantic_model_without_a_json_schema_still_registers_and_is_checked(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    """Before typed payloads such a handler registered; the schema is only
    for the OpenAPI document, so the document shows any object instead."""

    def connect(payload: WithConnection, ctx: JobContext) -> int:
        return payload.n

    handle = registry.handler("t.connect")(connect)
    deck = make_deck()
    with pytest.raises(InvalidField, match=r"^payload\.n: "):
        handle.enqueue(deck=deck)
    assert handle.enqueue(n=3, deck=deck).job.payload == {"n": 3}
    doc = create_app(deck=deck).test_client().get("/api/openapi.json")
    assert doc.status_code == 200
    assert doc.get_json()["components"]["schemas"]["Payload.t.connect"]["type"] == "object"


_CLOSED = {"today": False}


@dataclass
class Report:
    name: str

    def __post_init__(self) -> None:
        if _CLOSED["today"]:  # a check that depends on the day: valid when the schedule was read
            raise ValueError("reports are closed today")


def _report(payload: Report, ctx: JobContext) -> None:
    return None


def test_a_schedule_refused_at_its_fire_does_not_stop_the_others(registry: Registry, deck: Jobdeck) -> None:
    """A typed payload runs the user's checks at every fire; one that refuses
    must cost its own schedule's fire, not every schedule's, every tick."""
    from datetime import UTC, datetime

    from jobdeck.maintenance.cron import Periodic, parse_schedules

    registry.handler("t.report")(_report)
    targets = deck.schedules.targets
    entries = [{"name": "report", "cron": "* * * * *", "type": "t.report", "payload": {"name": "sales"}},
               {"name": "tick", "cron": "* * * * *", "type": "demo.noop", "payload": {}}]  # fmt: skip
    periodic = Periodic(deck.store, parse_schedules(entries, targets), targets, 1.0, health=deck.schedule_health.view)
    start = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    periodic.enqueue_due_once(start)
    _CLOSED["today"] = True
    try:
        ids = periodic.enqueue_due_once(start.replace(minute=1))
    finally:
        _CLOSED["today"] = False
    assert [deck.store.get(i).type for i in ids] == ["demo.noop"], "the other schedule fired"
    ids = periodic.enqueue_due_once(start.replace(minute=2))
    assert sorted(deck.store.get(i).type for i in ids) == ["demo.noop", "t.report"], "and the refused one fires again"


@dataclass
class Scaled:
    amount: int
    scale: InitVar[int] = 1
    scaled: int = field(init=False, default=0)

    def __post_init__(self, scale: int) -> None:
        self.scaled = self.amount * scale


def test_a_dataclass_with_an_initvar_is_refused_at_registration(registry: Registry) -> None:
    """An InitVar is given to ``__init__`` and not kept: an instance enqueued
    would be stored without it and run with its default, another value than
    the one enqueued (``Scaled(1, scale=3)`` ran as ``Scaled(1, scale=1)``)."""

    def charge(payload: Any, ctx: JobContext) -> int:
        return payload.scaled

    charge.__annotations__["payload"] = Scaled
    with pytest.raises(ValueError, match=r"^t\.scaled: payload type .*Scaled: its InitVar scale is not kept"):
        registry.handler("t.scaled")(charge)
    assert registry.get("t.scaled") is None
