"""``@handler`` returns a handle: still the function for its callers (and
for ``inspect``), and a way to enqueue its jobs by name of the function
rather than by a type string typed again. Real decks on both databases, and
a real worker pool running what a handle enqueued."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.errors import InvalidField, ItemRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handles import Handle, NoDeck, current_deck, use_deck
from jobdeck.runtime import pool_for
from jobdeck.store.records import JobFilter

from tests.conftest import Clock, all_in, wait_for

pytestmark = pytest.mark.backends


@pytest.fixture(autouse=True)
def _no_current_deck() -> Iterator[None]:
    """Each test starts with no process deck, and leaves the one it found."""
    before = use_deck(None)
    yield
    use_deck(before)


def test_the_handle_is_still_the_function_for_its_callers_and_for_inspect(registry: Registry) -> None:
    @registry.handler("billing.charge", max_retries=2)
    def charge(payload: dict[str, Any], ctx: JobContext | None) -> dict[str, Any]:
        """Charge an order."""
        return {"charged": payload["order_id"]}

    @registry.handler("pages.fetch")
    async def fetch(payload: dict[str, Any], ctx: JobContext | None) -> int:
        await asyncio.sleep(0)
        return 7

    assert isinstance(charge, Handle) and charge.type == "billing.charge"
    assert charge({"order_id": 3}, None) == {"charged": 3}, "existing callers keep calling the function"
    assert (charge.__name__, charge.__doc__, charge.__module__) == ("charge", "Charge an order.", __name__)
    assert str(inspect.signature(charge)) == str(inspect.signature(charge.__wrapped__))
    assert inspect.iscoroutinefunction(fetch) and asyncio.iscoroutinefunction(fetch)
    assert not inspect.iscoroutinefunction(charge)
    assert asyncio.run(fetch({}, None)) == 7
    assert registry.get("billing.charge").fn is charge.__wrapped__, "the registry keeps the plain function"
    assert registry.async_names() == {"pages.fetch"}
    assert charge.spec is registry.get("billing.charge") and charge.spec.max_retries == 2

    again = registry.handler("billing.charge-again")(charge)  # a handle registered again: its function is
    assert registry.get("billing.charge-again").fn is charge.__wrapped__ and again.type == "billing.charge-again"


def test_enqueue_takes_fields_or_a_payload_and_the_options(
    make_deck: Callable[..., Jobdeck], registry: Registry, clock: Clock
) -> None:
    @registry.handler("billing.charge", queue="billing")
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    deck = make_deck(clock=clock)
    job, created = charge.enqueue(order_id=7, amount=500, deck=deck)
    assert created and (job.type, job.payload, job.queue, job.available_at) == (
        "billing.charge", {"order_id": 7, "amount": 500}, "billing", clock.now,
    )  # fmt: skip
    later = charge.enqueue({"order_id": 8, "priority": "a field"}, delay=timedelta(minutes=5), priority="high",
                           deck=deck).job  # fmt: skip
    assert later.payload == {"order_id": 8, "priority": "a field"} and later.priority == 20
    assert later.available_at == clock.now + timedelta(minutes=5)
    assert charge.enqueue(deck=deck, delay=1.5, queue="other", max_retries=0).job.available_at == clock.now + timedelta(
        seconds=1.5
    )

    first = charge.enqueue(order_id=9, idempotency_key="charge:9", deck=deck)
    second = charge.enqueue(order_id=9, idempotency_key="charge:9", deck=deck)
    assert first.created and not second.created and second.job.id == first.job.id
    kept = charge.enqueue(order_id=10, unique={"period": 60}, deck=deck)
    dup = charge.enqueue(order_id=10, unique={"period": 60}, deck=deck)
    assert dup.duplicate and dup.job.id == kept.job.id

    with pytest.raises(TypeError, match="as one object or as fields, not both"):
        charge.enqueue({"order_id": 1}, amount=2, deck=deck)
    with pytest.raises(InvalidField, match="payload: must be a JSON object") as bad:
        charge.enqueue([1, 2], deck=deck)
    assert bad.value.field == "payload"
    with pytest.raises(InvalidField, match="delay_seconds"):
        charge.enqueue(order_id=1, delay=-1, deck=deck)
    stored = deck.store.list_jobs(JobFilter(type="billing.charge", limit=100), clock.now)
    assert len(stored) == 5, "the refused enqueues stored nothing"


def test_enqueue_many_is_one_transaction_and_one_refusal_refuses_all(
    make_deck: Callable[..., Jobdeck], registry: Registry, clock: Clock
) -> None:
    @registry.handler("mail.send")
    def send(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    deck = make_deck(clock=clock)
    made = send.enqueue_many([{"to": "a@example.test"}, {"to": "b@example.test"}], delay=60, priority=5, deck=deck)
    assert [e.job.payload["to"] for e in made] == ["a@example.test", "b@example.test"]
    assert all(
        e.created and e.job.priority == 5 and e.job.available_at == clock.now + timedelta(seconds=60) for e in made
    )

    with pytest.raises(ItemRefused, match=r"jobs\[1\]\.payload") as refused:
        send.enqueue_many([{"to": "c@example.test"}, {"ratio": float("nan")}], deck=deck)
    assert refused.value.index == 1
    assert len(deck.store.list_jobs(JobFilter(type="mail.send"), clock.now)) == 2, "nothing of the refused call"
    assert send.enqueue_many((p for p in [{"n": 1}]), deck=deck)[0].job.payload == {"n": 1}


def test_without_a_deck_the_error_says_how_to_give_one_and_a_configured_deck_is_used(
    make_config: Callable[..., Any], registry: Registry
) -> None:
    @registry.handler("billing.charge")
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    assert current_deck() is None
    with pytest.raises(NoDeck) as missing:
        charge.enqueue(order_id=1)
    message = str(missing.value)
    assert message.startswith("billing.charge: no Jobdeck to enqueue through")
    assert "deck=deck" in message and "Jobdeck.from_config" in message and "use_deck" in message

    app = create_app(make_config(), registry=registry)  # builds the process's deck from the config
    deck = app.extensions["jobdeck"]
    try:
        assert current_deck() is deck
        job = charge.enqueue(order_id=1).job
        assert deck.store.get(job.id).payload == {"order_id": 1}
        other = Jobdeck(make_config(), registry)  # built directly: not the process's deck unless named
        assert current_deck() is deck
        use_deck(other)
        assert charge.enqueue(order_id=2).job.id == job.id + 1 and current_deck() is other
        other.store.engine.dispose()
    finally:
        deck.store.engine.dispose()


def test_what_a_handle_enqueues_a_real_pool_runs_sync_and_async(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    @registry.handler("t.double")
    def double(payload: dict[str, Any], ctx: JobContext) -> int:
        return int(payload["n"]) * 2

    @registry.handler("t.triple")
    async def triple(payload: dict[str, Any], ctx: JobContext) -> int:
        await asyncio.sleep(0.01)
        return int(payload["n"]) * 3

    deck = make_deck()
    use_deck(deck)
    ids = [double.enqueue(n=4).job.id, triple.enqueue(n=5).job.id, *(e.job.id for e in double.enqueue_many([{"n": 6}]))]
    pool = pool_for(deck, 2)
    pool.start()
    try:
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED]), message="all three done")
    finally:
        pool.stop(grace=5)
    assert [deck.store.get(i).result for i in ids] == [8, 15, 12]


_OWN = Registry()


@_OWN.handler("t.by-reference")
def by_reference(payload: dict[str, Any], ctx: JobContext | None) -> dict[str, Any]:
    return {"got": payload}


def test_a_handle_pickles_and_copies_by_reference_as_a_function_does() -> None:
    """A plain function goes to a ``multiprocessing`` or ``concurrent.futures``
    process pool by its module and name; the handle must too, and not drag its
    registry along (nor fail because the function is no longer its module's)."""
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(by_reference)) is by_reference
    assert copy.copy(by_reference) is by_reference and copy.deepcopy(by_reference) is by_reference
    assert pickle.loads(pickle.dumps([by_reference]))[0]({"n": 1}, None) == {"got": {"n": 1}}


def test_a_registry_copy_has_the_handlers_and_keeps_its_own_registrations_to_itself() -> None:
    original = Registry()
    original.handler("billing.charge", max_retries=2)(lambda payload, ctx: None)
    copied = original.copy()
    assert copied.get("billing.charge") == original.get("billing.charge")

    @copied.handler("billing.refund")
    async def refund(payload: dict[str, Any], ctx: JobContext | None) -> None:
        """Refund an order."""

    copied.handler("billing.charge", max_retries=5)(lambda payload, ctx: None)
    assert copied.names() == ["billing.charge", "billing.refund"] and copied.async_names() == {"billing.refund"}
    assert original.names() == ["billing.charge"] and original.async_names() == frozenset()
    spec = original.get("billing.charge")
    assert spec is not None and spec.max_retries == 2
