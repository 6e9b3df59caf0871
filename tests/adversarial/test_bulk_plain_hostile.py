"""``Jobdeck.enqueue_bulk`` (``POST /api/jobs/bulk``, ``jobdeck enqueue
--file``) against ``Jobdeck.enqueue_each``, the path it replaced, on both
databases. The claim under test: for every input, ``enqueue_bulk`` stores
the same rows (every column but ``id``), gives the same answers, refuses
with the same error (index, inner field, words, HTTP status) and inserts
nothing after a refusal; it only takes a faster path for jobs of the plain
shape (``Intake.plain_shape``, ``Intake.plain_jobs``).

Each comparison runs ``enqueue_each`` on a deep copy of the items, records
what it stored and answered, empties the ``jobs`` table, then does the same
with ``enqueue_bulk``. Ids are compared by their rank among the rows stored
(a duplicate's answer names a job of the same call). Over HTTP, the
"before" is the route with ``deck.enqueue_bulk`` answering through
``enqueue_each``, as the route did before the change.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jobdeck import create_app
from jobdeck.core.errors import ItemRefused, JobdeckError
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.store.records import Answered

from tests.openapi_check import check

try:
    import pydantic
except ImportError:  # optional: Jobdeck never depends on it
    pydantic = None  # type: ignore[assignment]

pytestmark = pytest.mark.backends

BULK = "/api/jobs/bulk"


# -- typed handlers ----------------------------------------------------------------


@dataclass
class Order:
    sku: str
    qty: int
    note: str | None = None


class Mail(TypedDict):
    to: str
    tags: NotRequired[list[str]]


SHAPE_RUNS: list[int] = []
"""One entry per ``Counted`` built: how many times a payload shape's own code ran."""


@dataclass
class Counted:
    n: int

    def __post_init__(self) -> None:
        SHAPE_RUNS.append(self.n)


if pydantic is not None:

    class Charge(pydantic.BaseModel):
        """A common pydantic idiom: a ``before`` validator that fills a
        default into the incoming dict (pydantic hands it the caller's own
        object)."""

        order: int
        currency: str = "EUR"

        @pydantic.model_validator(mode="before")
        @classmethod
        def _defaults(cls, data: Any) -> Any:
            if isinstance(data, dict):
                data.setdefault("currency", "EUR")
            return data


def order_job(payload: Order, ctx: Any) -> None: ...


def mail_job(payload: Mail, ctx: Any) -> None: ...


def counted_job(payload: Counted, ctx: Any) -> None: ...


def charge_job(payload: Charge, ctx: Any) -> None: ...


def plain_job(payload: dict[str, Any], ctx: Any) -> None: ...


CAFE = "shop.caf\u00e9"
"""A type registered under its NFC name; jobs may spell it decomposed."""
CAFE_NFD = "shop.cafe\u0301"


def register(registry: Registry) -> None:
    registry.handler("shop.order")(order_job)
    registry.handler("shop.mail", queue="mail", priority=7)(mail_job)
    registry.handler("shop.slow", queue="slow", priority=-3, max_retries=9)(plain_job)
    registry.handler("shop.once")(plain_job)
    registry.handler("shop.keyed")(plain_job)
    registry.handler("shop.counted")(counted_job)
    registry.handler(CAFE)(plain_job)
    if pydantic is not None:
        registry.handler("shop.charge")(charge_job)


TYPES_CONFIG = {"shop.once": {"unique": {"by": ["type", "payload.u"]}}}


@pytest.fixture
def shop(make_deck: Any, registry: Registry, clock: Any) -> Callable[..., Jobdeck]:
    """A deck with the shop types (and ``shop.once`` unique by ``payload.u``), config overrides added."""
    register(registry)

    def make(**overrides: Any) -> Jobdeck:
        overrides.setdefault("types", TYPES_CONFIG)
        return make_deck(clock, **overrides)

    return make


# -- what a call did -----------------------------------------------------------------


def rows(deck: Jobdeck) -> list[dict[str, Any]]:
    with deck.store.engine.connect() as conn:
        return [dict(m) for m in conn.exec_driver_sql("SELECT * FROM jobs ORDER BY id").mappings()]


def wipe(deck: Jobdeck) -> None:
    with deck.store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM jobs")


def total(deck: Jobdeck) -> int:
    return sum(deck.store.counts(deck.clock()).values())


def refusal(exc: JobdeckError) -> tuple[Any, ...]:
    """An error as compared: a job id it names (a key's job, made earlier in
    the same rolled-back call) is left out, as ids are."""
    refused = getattr(exc, "refused", None)
    return (
        type(exc).__name__,
        getattr(exc, "index", None),
        getattr(exc, "inner_field", None),
        _no_ids(str(exc)),
        getattr(exc, "status_code", None),
        type(refused).__name__ if refused is not None else None,
        _no_ids(str(refused)) if refused is not None else None,
    )


def _no_ids(text: str) -> str:
    return re.sub(r"\bjob \d+\b", "job <id>", text)


def each(deck: Jobdeck) -> Callable[[Any], list[tuple[int, bool, bool, bool]]]:
    return lambda items: [(e.job.id, e.created, e.duplicate, e.changed) for e in deck.enqueue_each(items)]


def bulk(deck: Jobdeck) -> Callable[[Any], list[tuple[int, bool, bool, bool]]]:
    def run(items: Any) -> list[tuple[int, bool, bool, bool]]:
        got = deck.enqueue_bulk(items)
        assert all(type(a) is Answered for a in got)
        return [tuple(a) for a in got]  # type: ignore[misc]

    return run


def outcome(deck: Jobdeck, run: Callable[[Any], Any], items: Any) -> dict[str, Any]:
    """What ``run(items)`` did on an empty table: its answers (ids as ranks
    among the rows) or its refusal, and the rows stored (ids left out)."""
    wipe(deck)
    try:
        answers = run(copy.deepcopy(items))
    except JobdeckError as exc:
        stored = rows(deck)
        return {"refused": refusal(exc), "rows": stored}
    stored = rows(deck)
    rank = {r["id"]: i for i, r in enumerate(stored)}
    return {
        "answers": [(rank.get(i, ("not stored", i)), *rest) for i, *rest in answers],
        "rows": [{k: v for k, v in r.items() if k != "id"} for r in stored],
    }


def same_as_each(deck: Jobdeck, items: Any) -> dict[str, Any]:
    """Assert ``enqueue_bulk(items)`` did what ``enqueue_each(items)`` does; returns what it did."""
    before = outcome(deck, each(deck), items)
    after = outcome(deck, bulk(deck), items)
    if "refused" in before:
        assert before["rows"] == [], "enqueue_each inserted after a refusal"
    assert after == before, _difference(before, after)
    wipe(deck)
    return after


def _difference(before: dict[str, Any], after: dict[str, Any]) -> str:
    if before.keys() != after.keys():
        return f"enqueue_each: {before.get('refused') or 'stored'}; enqueue_bulk: {after.get('refused') or 'stored'}"
    if "refused" in before and before["refused"] != after["refused"]:
        return f"refusals differ:\n each: {before['refused']}\n bulk: {after['refused']}"
    if before.get("answers") != after.get("answers"):
        return f"answers differ:\n each: {before['answers']}\n bulk: {after['answers']}"
    if len(before["rows"]) != len(after["rows"]):
        return f"{len(before['rows'])} rows stored by enqueue_each, {len(after['rows'])} by enqueue_bulk"
    for i, (b, a) in enumerate(zip(before["rows"], after["rows"], strict=True)):
        if a != b:
            return f"row {i} differs: " + repr({k: {"each": b[k], "bulk": a[k]} for k in b if a.get(k) != b[k]})
    return "differs"


# -- over HTTP -----------------------------------------------------------------------


@pytest.fixture
def before_change(monkeypatch: pytest.MonkeyPatch) -> Callable[[Jobdeck], Any]:
    """A context in which ``deck.enqueue_bulk`` answers as the route did before
    the change: through ``enqueue_each``, each ``Enqueued`` by its id."""

    @contextlib.contextmanager
    def patched(deck: Jobdeck) -> Iterator[None]:
        def enqueue_bulk(items: Any) -> list[Answered]:
            return [Answered(e.job.id, e.created, e.duplicate, e.changed) for e in deck.enqueue_each(items)]

        with monkeypatch.context() as m:
            m.setattr(deck, "enqueue_bulk", enqueue_bulk)
            yield

    return patched


def http_outcome(deck: Jobdeck, client: Any, body: Any, **kw: Any) -> dict[str, Any]:
    wipe(deck)
    if isinstance(body, bytes):
        r = client.post(BULK, data=body, content_type="application/json", **kw)
    else:
        r = client.post(BULK, json=body, **kw)
    answer = check(r, BULK, "post")
    stored = rows(deck)
    rank = {row["id"]: i for i, row in enumerate(stored)}
    if r.status_code in (200, 201):
        answer = {"jobs": [{**j, "id": rank.get(j["id"], ("not stored", j["id"]))} for j in answer["jobs"]]}
    return {
        "status": r.status_code,
        "body": answer,
        "rows": [{k: v for k, v in row.items() if k != "id"} for row in stored],
    }


def http_same_as_before(deck: Jobdeck, before_change: Any, body: Any, **kw: Any) -> dict[str, Any]:
    client = create_app(deck=deck).test_client()
    with before_change(deck):
        before = http_outcome(deck, client, body, **kw)
    after = http_outcome(deck, client, body, **kw)
    assert after["status"] == before["status"], (before["status"], before["body"], after["status"], after["body"])
    assert after["body"] == before["body"]
    assert after["rows"] == before["rows"], _difference(
        {"answers": None, "rows": before["rows"]}, {"answers": None, "rows": after["rows"]}
    )
    if after["status"] not in (200, 201):
        assert after["rows"] == [], "a refused call inserted jobs"
    wipe(deck)
    return after


# -- stored rows and answers -----------------------------------------------------------


PAYLOADS: dict[str, Any] = {
    "absent": ...,
    "none": None,
    "empty": {},
    "nested": {"a": {"b": [1, {"c": None, "d": [True, False]}], "e": {}}, "f": []},
    "unicode-values": {"s": "caf\u00e9 \u2603 \U0001f600 \u05e9\u05dc\u05d5\u05dd", "t": "\u200b"},
    "nul-characters": {"s": "a\u0000b", "k\u0000": ["\u0000", {"\u0000": "\u0000"}]},
    "non-ascii-keys": {"cl\u00e9": 1, "\u952e": {"\u0444": "x"}, "\U0001f511": None},
    "big-ints": {"a": 2**63, "b": -(2**63) - 1, "c": 2**64 + 1, "d": 10**99, "e": [2**80], "f": -(10**40)},
    "floats": {"a": 0.1, "b": 1e308, "c": -0.0, "d": 5e-324, "e": 1.0, "f": [2.5e-10, 123456789.125]},
    "booleans-and-nulls": {"t": True, "f": False, "n": None, "l": [True, None, False]},
    "odd-keys": {"": 1, " ": 2, "a.b": 3, "$ref": 4, "__proto__": {"x": 1}, "0": 5},
    "long-string": {"s": "x" * 5000},
    "escapes": {"q": '"\\/\b\f\n\r\t', "c": "\x01\x1f\x7f"},
}


@pytest.mark.parametrize("shape", list(PAYLOADS))
def test_payload_shapes_are_stored_and_answered_as_enqueue_each(shop: Any, shape: str) -> None:
    deck = shop()
    payload = PAYLOADS[shape]
    job = {"type": "demo.noop"} if payload is ... else {"type": "demo.noop", "payload": payload}
    items = [
        {"type": "demo.report", "payload": {"first": True}},
        job,  # the first of its type: checked by new_job
        copy.deepcopy(job),  # the next ones: checked by the one pass's payload_json
        {"type": "demo.noop", "payload": {"between": 1}},
        copy.deepcopy(job),
    ]
    after = same_as_each(deck, items)
    assert [a[1:] for a in after["answers"]] == [(True, False, False)] * len(items)
    expected = {} if payload in (..., None) else payload
    stored = [json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"] for r in after["rows"]]
    assert stored[1] == stored[2] == stored[4] == expected


@pytest.mark.parametrize("via", ["in-process", "http"])
def test_several_types_with_their_own_defaults_and_typed_payloads(shop: Any, before_change: Any, via: str) -> None:
    deck = shop()
    items = [
        {"type": "shop.mail", "payload": {"to": "a@example.com", "tags": ["x", "\u00e9"]}},
        {"type": "shop.order", "payload": {"sku": "A-1", "qty": 2}},
        {"type": "shop.slow"},
        {"type": "demo.report", "payload": {"r": 1}},
        {"type": "shop.order", "payload": {"sku": "A-2", "qty": 0, "note": None}},
        {"type": "shop.mail", "payload": {"to": "b@example.com"}},
        {"type": "shop.slow", "payload": {"s": 1}},
        {"type": "demo.noop", "payload": None},
        {"type": "shop.order", "payload": {"sku": "A-3", "qty": -1, "note": "n"}},
    ]
    if via == "http":
        after = http_same_as_before(deck, before_change, {"jobs": items})
        assert after["status"] == 201
    else:
        after = same_as_each(deck, items)
    got = [(r["type"], r["queue"], r["priority"], r["max_retries"]) for r in after["rows"]]
    default_retries = deck.config.default_max_retries
    assert got[0] == ("shop.mail", "mail", 7, default_retries)
    assert got[2] == got[6] == ("shop.slow", "slow", -3, 9)
    assert got[3][:2] == ("demo.report", "reports")


def test_a_type_spelled_decomposed_and_composed_in_one_call(shop: Any) -> None:
    """The one pass keeps a type's defaults under its NFC name and looks
    each job's type up as given: both spellings must store the NFC name."""
    deck = shop()
    items = [
        {"type": CAFE_NFD, "payload": {"n": 1}},
        {"type": CAFE, "payload": {"n": 2}},
        {"type": CAFE_NFD, "payload": {"n": 3}},
        {"type": CAFE, "payload": {"n": 4}},
    ]
    after = same_as_each(deck, items)
    assert {r["type"] for r in after["rows"]} == {CAFE}


def test_a_unique_type_in_the_config_answers_duplicates_as_enqueue_each(shop: Any, before_change: Any) -> None:
    deck = shop()
    items = [
        {"type": "demo.noop", "payload": {"n": 1}},
        {"type": "shop.once", "payload": {"u": "a"}},
        {"type": "shop.once", "payload": {"u": "b"}},
        {"type": "shop.once", "payload": {"u": "a", "v": 2}},
        {"type": "demo.noop", "payload": {"n": 2}},
    ]
    after = same_as_each(deck, items)
    assert [a[1:3] for a in after["answers"]] == [(True, False), (True, False), (True, False), (False, True),
                                                  (True, False)]  # fmt: skip
    assert after["answers"][3][0] == after["answers"][1][0]
    # unique last: the pass sees a plain first job, then the unique type
    http = http_same_as_before(deck, before_change, {"jobs": items[::-1]})
    assert http["status"] == 201 and len(http["rows"]) == 4


def test_keyed_flow_limits_store_the_keys_as_enqueue_each(shop: Any, before_change: Any) -> None:
    deck = shop(types={**TYPES_CONFIG, "shop.keyed": {"concurrency": 1, "concurrency_key": "payload.k"}})
    items = [
        {"type": "shop.keyed", "payload": {"k": "a"}},
        {"type": "demo.noop", "payload": {"k": "a"}},
        {"type": "shop.keyed", "payload": {"k": 7}},
        {"type": "shop.keyed"},
        {"type": "shop.keyed", "payload": {"k": {"nested": ["\u00e9"]}}},
    ]
    after = same_as_each(deck, items)
    assert [r["concurrency_key"] for r in after["rows"]] == ['"a"', None, "7", "null", '{"nested":["\u00e9"]}']
    assert http_same_as_before(deck, before_change, {"jobs": items})["status"] == 201


def test_the_trace_context_is_stored_as_enqueue_each_stores_it(
    shop: Any, before_change: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")  # no provider set for this process: other tests set theirs
    deck = shop(tracing={"enabled": True})
    items = [{"type": "demo.noop", "payload": {"n": n}} for n in range(3)] + [{"type": "shop.slow"}]
    span = NonRecordingSpan(SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1)))
    with trace.use_span(span):
        after = same_as_each(deck, items)
    expected = "00-00000000000000000000000000001234-0000000000005678-01"
    assert [r["traceparent"] for r in after["rows"]] == [expected] * 4
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    http = http_same_as_before(deck, before_change, {"jobs": items}, headers={"traceparent": header})
    assert [r["traceparent"] for r in http["rows"]] == [header] * 4
    assert same_as_each(deck, items)["rows"][0]["traceparent"] is None, "no span, no request: no trace"


# -- refusals ------------------------------------------------------------------------


V = {"type": "demo.noop", "payload": {"ok": 1}}
ORDER = {"type": "shop.order", "payload": {"sku": "S", "qty": 1}}

REFUSED: dict[str, tuple[list[Any], int]] = {
    "bad-payload-first": ([{"type": "demo.noop", "payload": [1]}, V, V], 0),
    "bad-payload-after-its-type": ([V, ORDER, V, {"type": "demo.noop", "payload": "text"}, V], 3),
    "payload-false": ([V, {"type": "demo.noop", "payload": False}], 1),
    "payload-zero": ([V, {"type": "demo.noop", "payload": 0}], 1),
    "payload-empty-list": ([V, {"type": "demo.noop", "payload": []}], 1),
    "too-large-first": ([{"type": "demo.noop", "payload": {"s": "x" * 993}}, V], 0),
    "too-large-after-its-type": ([V, V, {"type": "demo.noop", "payload": {"s": "x" * 993}}], 2),
    "too-large-multibyte": ([V, {"type": "demo.noop", "payload": {"s": "\u00e9" * 497}}], 1),
    "unknown-type-later": ([V, ORDER, {"type": "demo.nope", "payload": {}}], 2),
    "type-with-a-space": ([V, {"type": " demo.noop", "payload": {}}], 1),
    "type-blank": ([V, {"type": "   "}], 1),
    "type-not-a-string": ([V, {"type": 7, "payload": {}}], 1),
    "type-null": ([V, {"type": None}], 1),
    "type-missing": ([V, {"payload": {"a": 1}}], 1),
    "empty-object": ([V, {}], 1),
    "item-an-int": ([V, V, 7], 2),
    "item-null": ([V, None, V], 1),
    "item-a-string": (["demo.noop", V], 0),
    "item-a-list": ([V, [V]], 1),
    "extra-key": ([V, V, {"type": "demo.noop", "payload": {}, "colour": "red"}], 2),
    "extra-key-first": ([{"type": "demo.noop", "colour": "red"}, V], 0),
    "typed-missing-field-after-valid": ([ORDER, V, {"type": "shop.order", "payload": {"sku": "S"}}], 2),
    "typed-wrong-kind-first": ([{"type": "shop.order", "payload": {"sku": 1, "qty": 1}}, ORDER], 0),
    "typed-unknown-field-later": ([ORDER, ORDER, {"type": "shop.order", "payload": {"sku": "S", "qty": 1, "x": 0}}], 2),
    "typed-payload-null-later": ([ORDER, {"type": "shop.order", "payload": None}], 1),
    "typed-nested-list-later": (
        [
            {"type": "shop.mail", "payload": {"to": "a"}},
            {"type": "shop.mail", "payload": {"to": "b", "tags": ["ok", 3]}},
        ],
        1,
    ),
    "deep-after-valid": ([V, {"type": "demo.noop", "payload": json.loads('{"a":' * 80 + "1" + "}" * 80)}], 1),
    "two-bad-first-wins": ([V, {"type": "demo.nope"}, {"type": "demo.noop", "payload": [1]}], 1),
    "bad-then-plain-shape-miss": ([V, {"type": "demo.noop", "payload": [1]}, {"type": "demo.noop", "priority": 3}], 1),
    "non-plain-then-bad": ([{"type": "demo.noop", "priority": 3}, V, {"type": "demo.noop", "payload": [1]}], 2),
}
"""Calls ``enqueue_each`` refuses, and the index it names: all JSON, so each is sent over HTTP too."""

PYTHON_ONLY: dict[str, tuple[list[Any], int]] = {
    "nan": ([V, {"type": "demo.noop", "payload": {"x": float("nan")}}], 1),
    "infinity-nested": ([V, {"type": "demo.noop", "payload": {"x": [1, float("-inf")]}}], 1),
    "lone-surrogate-value": ([V, V, {"type": "demo.noop", "payload": {"x": "\ud800"}}], 2),
    "lone-surrogate-key": ([V, {"type": "demo.noop", "payload": {"\udfff": 1}}], 1),
    "int-key": ([V, {"type": "demo.noop", "payload": {1: 2}}], 1),
    "not-json": ([V, {"type": "demo.noop", "payload": {"x": object()}}], 1),
    "a-set": ([V, {"type": "demo.noop", "payload": {"x": {1, 2}}}], 1),
    "too-many-digits": ([V, {"type": "demo.noop", "payload": {"x": 10**5000}}], 1),
    "holds-itself": ([V, {"type": "demo.noop", "payload": (lambda d: (d.__setitem__("me", d), d)[1])({})}], 1),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refusal_names_the_same_job_field_and_words(shop: Any, before_change: Any, case: str) -> None:
    deck = shop(max_payload_bytes=1000)
    items, index = REFUSED[case]
    after = same_as_each(deck, items)
    assert "refused" in after, f"accepted: {after}"
    kind, got_index, *_ = after["refused"]
    assert (kind, got_index) == ("ItemRefused", index)
    http = http_same_as_before(deck, before_change, {"jobs": items})
    assert http["status"] in (413, 422) and http["body"]["index"] == index
    assert total(deck) == 0


@pytest.mark.parametrize("case", list(PYTHON_ONLY))
def test_a_refusal_of_what_json_cannot_carry_names_the_same_job(shop: Any, case: str) -> None:
    deck = shop()
    items, index = PYTHON_ONLY[case]
    after = same_as_each(deck, items)
    assert "refused" in after and after["refused"][:2] == ("ItemRefused", index), after


@pytest.mark.parametrize("count", [0, 1, 3, 4])
def test_max_bulk_jobs_at_and_past_the_boundary(shop: Any, before_change: Any, count: int) -> None:
    deck = shop(max_bulk_jobs=3)
    items = [{"type": "demo.noop", "payload": {"i": i}} for i in range(count)]
    after = same_as_each(deck, items)
    http = http_same_as_before(deck, before_change, {"jobs": items})
    if 1 <= count <= 3:
        assert len(after["rows"]) == count and http["status"] == 201
    else:
        assert after["refused"][0] == "InvalidField" and http["status"] == 422
        assert http["body"]["error"] == f"jobs: 1 to 3 jobs in one call (max_bulk_jobs), not {count}"


def test_payloads_exactly_at_max_payload_bytes_are_taken_by_both(shop: Any) -> None:
    deck = shop(max_payload_bytes=1000)
    ascii_at = {"type": "demo.noop", "payload": {"s": "x" * 992}}  # {"s":"..."}: 8 + 992 bytes
    multibyte_at = {"type": "demo.noop", "payload": {"s": "\u00e9" * 496}}  # 8 + 2 * 496
    four_byte_at = {"type": "demo.noop", "payload": {"s": "\U0001f600" * 248}}  # 8 + 4 * 248
    after = same_as_each(deck, [V, ascii_at, multibyte_at, four_byte_at, ascii_at])
    assert len(after["rows"]) == 5


# -- the route -------------------------------------------------------------------------


def test_the_route_answers_plain_calls_as_before(shop: Any, before_change: Any) -> None:
    deck = shop()
    items = [{"type": "demo.noop", "payload": {"i": i, "s": "\u00e9" * (i % 3)}} for i in range(50)]
    http = http_same_as_before(deck, before_change, {"jobs": items})
    assert http["status"] == 201
    assert http["body"] == {"jobs": [{"id": i, "created": True, "duplicate": False, "replaced": False}
                                     for i in range(50)]}  # fmt: skip
    raw = b'{"jobs": [{"type": "demo.noop", "payload": {"a": 1, "a": 2}}, {"payload": null, "type": "demo.noop"}]}'
    assert http_same_as_before(deck, before_change, raw)["status"] == 201, "duplicate keys: the last wins, as before"


def test_a_call_where_every_job_was_there_already_is_200_as_before(shop: Any, before_change: Any) -> None:
    deck = shop()
    client = create_app(deck=deck).test_client()
    first = client.post("/api/jobs", json={"type": "shop.once", "payload": {"u": "z"}})
    assert first.status_code == 201

    def seeded() -> dict[str, Any]:
        r = client.post(BULK, json={"jobs": [{"type": "shop.once", "payload": {"u": "z"}}] * 2})
        return {"status": r.status_code, "body": check(r, BULK, "post")}

    with before_change(deck):
        before = seeded()
    assert seeded() == before and before["status"] == 200


def test_auth_cross_site_and_media_type_refuse_before_any_job_is_read(shop: Any) -> None:
    secret = "tok-enqueue-0123456789"
    reader = "tok-read-0123456789"
    tokens = {
        "writer": {"token_sha256": hashlib.sha256(secret.encode()).hexdigest(), "scopes": ["enqueue"]},
        "reader": {"token_sha256": hashlib.sha256(reader.encode()).hexdigest(), "scopes": ["read"]},
    }
    deck = shop(api_token="legacy-s3cret", api_tokens=tokens)
    client = create_app(deck=deck).test_client()
    body = {"jobs": [{"type": "demo.noop", "payload": {"n": 1}}]}

    def post(**kw: Any) -> Any:
        r = client.post(BULK, json=body, **kw)
        check(r, BULK, "post")
        return r

    assert post().status_code == 401
    assert post(headers={"Authorization": "Bearer nope"}).status_code == 401
    assert post(headers={"Authorization": f"Bearer {reader}"}).status_code == 403
    evil = post(headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "cross-origin" in evil.get_json()["error"]
    r = client.post(
        BULK, data=json.dumps(body), content_type="text/plain", headers={"Authorization": "Bearer " + secret}
    )
    assert r.status_code == 415
    assert total(deck) == 0
    assert post(headers={"Authorization": f"Bearer {secret}"}).status_code == 201
    assert post(headers={"Authorization": "Bearer legacy-s3cret"}).status_code == 201
    assert total(deck) == 2

    open_deck = shop()  # no token: a browser's cross-site request is what stands out
    r = create_app(deck=open_deck).test_client().post(BULK, json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "cross-origin" in check(r, BULK, "post")["error"]
    assert total(deck) == 2


def test_a_body_at_max_bulk_bytes_is_taken_and_one_byte_past_is_413(shop: Any, before_change: Any) -> None:
    cap = 200_000
    deck = shop(max_bulk_bytes=cap, max_payload_bytes=1000)
    body = json.dumps({"jobs": [{"type": "demo.noop", "payload": {"i": i, "s": "y" * 900}} for i in range(150)]})
    assert len(body) < cap
    at_cap = body.encode() + b" " * (cap - len(body))
    http = http_same_as_before(deck, before_change, at_cap)
    assert http["status"] == 201 and len(http["rows"]) == 150
    over = http_same_as_before(deck, before_change, at_cap + b" ")
    assert over["status"] == 413 and over["body"]["error"].endswith("(max_bulk_bytes)")


# -- concurrency ---------------------------------------------------------------------


def run_threads(target: Callable[[int], None], n: int, timeout: float = 120) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), name=f"bulk-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish before its deadline"
    if errors:
        raise errors[0]


def test_concurrent_calls_lose_nothing_duplicate_nothing_and_answer_in_order(shop: Any) -> None:
    deck = shop()
    app = create_app(deck=deck)
    threads, calls, size = 4, 5, 200
    barrier = threading.Barrier(threads)
    answers: dict[tuple[int, int], list[int]] = {}
    lock = threading.Lock()

    def items(t: int, c: int) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = [{"type": "demo.noop", "payload": {"t": t, "c": c, "i": i}} for i in range(size)]
        if c % 2:  # every other call takes the old path: a keyed job in the middle
            jobs[size // 2] = {**jobs[size // 2], "idempotency_key": f"k-{t}-{c}"}
        if c == 4:
            jobs[0] = {"type": "shop.mail", "payload": {"to": f"{t}@x"}}
        return jobs

    def work(t: int) -> None:
        client = app.test_client()
        barrier.wait(timeout=30)
        for c in range(calls):
            if t == 0 and c % 2 == 0:  # in-process beside the route
                got = [a.id for a in deck.enqueue_bulk(items(t, c))]
            else:
                r = client.post(BULK, json={"jobs": items(t, c)})
                assert r.status_code == 201, r.get_json()
                got = [j["id"] for j in r.get_json()["jobs"]]
            with lock:
                answers[(t, c)] = got

    run_threads(work, threads)
    stored = {r["id"]: r for r in rows(deck)}
    assert len(stored) == threads * calls * size, "jobs lost or added"
    seen: set[int] = set()
    for (t, c), ids in answers.items():
        assert len(ids) == size and not (set(ids) & seen), f"an id answered twice ({t}, {c})"
        seen |= set(ids)
        for i, (job_id, item) in enumerate(zip(ids, items(t, c), strict=True)):
            row = stored[job_id]
            payload = json.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
            assert (row["type"], payload) == (item["type"], item["payload"]), f"call ({t}, {c}) job {i}"
    assert seen == set(stored)


def test_concurrent_unique_calls_agree_on_the_kept_jobs(shop: Any) -> None:
    """Calls of the plain shape that reach a unique type fall back to
    enqueue_each: concurrently, one job per key, every answer naming it."""
    deck = shop()
    app = create_app(deck=deck)
    keys = [f"u{n}" for n in range(40)]
    answers: list[list[dict[str, Any]]] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def work(t: int) -> None:
        client = app.test_client()
        order = keys if t % 2 == 0 else keys[::-1]
        jobs = [{"type": "demo.noop", "payload": {"t": t}}] + [
            {"type": "shop.once", "payload": {"u": k}} for k in order
        ]
        barrier.wait(timeout=30)
        r = client.post(BULK, json={"jobs": jobs})
        assert r.status_code == 201, r.get_json()
        answers[t] = [{**j, "key": j_key} for j, j_key in zip(r.get_json()["jobs"][1:], order, strict=True)]

    run_threads(work, 4)
    kept: dict[str, int] = {}
    for answer in answers:
        for j in answer:
            assert kept.setdefault(j["key"], j["id"]) == j["id"], f"two jobs kept for {j['key']}"
    assert sum(j["created"] for a in answers for j in a) == len(keys)
    assert total(deck) == len(keys) + 4


# -- double checking: the fallback checks the jobs a second time ---------------------------


FALLBACKS = {
    "a-later-job-with-priority": {"type": "demo.noop", "payload": {}, "priority": 5},
    "a-unique-type-later": {"type": "shop.once", "payload": {"u": "x"}},
    "keyed-later": {"type": "demo.noop", "idempotency_key": "k"},
}


@pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")
@pytest.mark.parametrize("trigger", ["a-later-job-with-priority", "a-unique-type-later"])
@pytest.mark.parametrize("via", ["in-process", "http"])
def test_a_shape_that_fills_defaults_in_place_is_stored_as_enqueue_each(
    shop: Any, before_change: Any, trigger: str, via: str
) -> None:
    """``enqueue_each`` serializes each payload before its shape is checked:
    a pydantic ``before`` validator that fills a default into the dict
    (``data.setdefault``) does not change what is stored. ``enqueue_bulk``'s
    one pass checks the shapes of the jobs before the one that sends it
    back to ``enqueue_each``, which then serializes the payloads that pass
    changed: stored rows differ from ``enqueue_each``'s."""
    deck = shop()
    items = [
        {"type": "shop.charge", "payload": {"order": 1}},
        {"type": "shop.charge", "payload": {"order": 2}},
        FALLBACKS[trigger],
    ]
    if via == "http":
        http_same_as_before(deck, before_change, {"jobs": items})
    else:
        after = same_as_each(deck, items)
        assert json.loads(after["rows"][0]["payload"]) == {"order": 1}


@pytest.mark.parametrize("trigger", ["a-later-job-with-priority", "keyed-later", "a-refused-job-later"])
def test_each_jobs_payload_shape_runs_once_as_under_enqueue_each(shop: Any, trigger: str) -> None:
    """A payload shape's own code (``__post_init__``, a validator) runs once
    per job under ``enqueue_each``; a handler's class may count, log or
    call out there. The one pass runs it for the jobs before its fallback,
    and ``enqueue_each`` runs it for them again."""
    deck = shop()
    last = FALLBACKS.get(trigger, {"type": "demo.noop", "payload": [1]})
    items = [{"type": "shop.counted", "payload": {"n": n}} for n in range(5)] + [last]
    runs = []
    for enqueue in (deck.enqueue_each, deck.enqueue_bulk):
        wipe(deck)
        SHAPE_RUNS.clear()
        with contextlib.suppress(ItemRefused):
            enqueue(copy.deepcopy(items))
        runs.append(sorted(SHAPE_RUNS))
    wipe(deck)
    assert runs[1] == runs[0], f"shape runs: enqueue_each {runs[0]}, enqueue_bulk {runs[1]}"


@pytest.mark.parametrize("trigger", ["a-later-job-with-priority", "a-refused-job-later"])
def test_no_job_is_checked_more_often_than_enqueue_each_checks_it(
    shop: Any, trigger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only faster: a call that ends in a job outside the one pass's shape
    (or refused) should not cost more checking than ``enqueue_each`` did.
    Counted as ``Intake.payload_json`` calls (each serializes and walks a
    payload of up to ``max_payload_bytes``)."""
    deck = shop()
    last = FALLBACKS.get(trigger, {"type": "demo.noop", "payload": [1]})
    items = [{"type": "demo.noop", "payload": {"i": i, "s": "p" * 100}} for i in range(200)] + [last]
    calls = [0]
    payload_json = deck.intake.payload_json

    def counted(payload: Any) -> str:
        calls[0] += 1
        return payload_json(payload)

    monkeypatch.setattr(deck.intake, "payload_json", counted)
    counts = []
    for enqueue in (deck.enqueue_each, deck.enqueue_bulk):
        wipe(deck)
        calls[0] = 0
        with contextlib.suppress(ItemRefused):
            enqueue(copy.deepcopy(items))
        counts.append(calls[0])
    wipe(deck)
    assert counts[1] <= counts[0], f"payloads checked: enqueue_each {counts[0]}, enqueue_bulk {counts[1]}"


# -- differential fuzzing ------------------------------------------------------------


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8) | st.sampled_from(
    ["", "a\u0000b", "\u00e9", "e\u0301", "\U0001f600", "\u200b", "x" * 300]
)
_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_ANY_PAYLOAD = st.dictionaries(_TEXT, _JSON, max_size=4) | st.just(None) | st.just({})
_VALID_PAYLOADS: dict[str, Any] = {
    "shop.order": st.builds(
        lambda s, q, n: {"sku": s, "qty": q, **n}, _TEXT, st.integers(-5, 5), st.sampled_from([{}, {"note": None}])
    ),
    "shop.mail": st.builds(lambda t, tags: {"to": t, **tags}, _TEXT, st.sampled_from([{}, {"tags": ["a", "\u00e9"]}])),
    "shop.once": st.builds(lambda u, x: {"u": u, **x}, st.sampled_from(["a", "b"]), st.sampled_from([{}, {"v": 1}])),
}
_BAD_PAYLOADS = st.sampled_from([[], [1], "x", 0, False, {"sku": "s"}, {"to": 1}, {"s": "z" * 1200}])
_VALID_TYPES = st.sampled_from(
    ["demo.noop", "demo.noop", "demo.report", "shop.order", "shop.mail", "shop.slow", "shop.once", CAFE, CAFE_NFD]
)
_BAD_TYPES = st.sampled_from(["demo.nope", " demo.noop", "", 7, None])


@st.composite
def _items(draw: Any) -> Any:
    """Mostly jobs of the one pass's shape that the single enqueue takes
    (a typed type may still refuse a payload that is not its shape), now
    and then a refused one or one of another shape."""
    kind = draw(st.integers(0, 39))
    if kind == 0:
        return draw(st.sampled_from([7, None, "demo.noop", [], {}]))
    item: dict[str, Any] = {"type": draw(_BAD_TYPES if kind == 1 else _VALID_TYPES)}
    if draw(st.integers(0, 4)) or item["type"] in ("shop.order", "shop.mail", "shop.once"):
        good = _VALID_PAYLOADS.get(item["type"], _ANY_PAYLOAD) if isinstance(item["type"], str) else _ANY_PAYLOAD
        item["payload"] = draw(_BAD_PAYLOADS if kind == 2 else good)
    if kind == 3:
        item["priority"] = draw(st.sampled_from([1, "high", "urgent"]))
    elif kind == 4:
        item["idempotency_key"] = draw(st.sampled_from(["k1", "k2"]))
    elif kind == 5:
        item["colour"] = "red"
    return item


@settings(
    max_examples=300, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(items=st.lists(_items(), min_size=1, max_size=6))
def test_fuzzed_calls_store_answer_and_refuse_as_enqueue_each(shop: Any, items: list[Any]) -> None:
    deck = _fuzz_deck(shop)
    one_pass = "one pass" if deck.intake.plain_shape(items) else "another shape"
    did = same_as_each(deck, items)
    event(f"{one_pass}: {'refused' if 'refused' in did else 'stored'}")


_FUZZ_DECKS: dict[int, Jobdeck] = {}


def _fuzz_deck(shop: Any) -> Jobdeck:
    """One deck per test (hypothesis calls the test body once per example, with the same fixtures)."""
    key = id(shop)
    if key not in _FUZZ_DECKS:
        _FUZZ_DECKS.clear()
        _FUZZ_DECKS[key] = shop(max_payload_bytes=1000)
    return _FUZZ_DECKS[key]


@pytest.fixture(autouse=True)
def _fuzz_decks_forgotten() -> Iterator[None]:
    yield
    _FUZZ_DECKS.clear()
