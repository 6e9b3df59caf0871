"""The effects ledger (``ctx.effect``) on both databases: two-phase records,
a redelivery that returns the stored result, an unknown outcome that goes to
dead instead of being skipped or repeated, replay-safe effects, and what a
person may mark. Real jobs, claimed and failed through the store, so the
ledger is checked against the attempts a worker would really run."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from jobdeck.core.errors import EffectNotFound, EffectNotPerformed, EffectOutcomeUnknown, EffectResolveRefused
from jobdeck.core.states import EffectState, State
from jobdeck.deck import Jobdeck
from jobdeck.demo import FakeGateway
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.store.ledger import storable
from jobdeck.store.models import demo_charges
from sqlalchemy import func, select

from tests.conftest import wait_for

pytestmark = pytest.mark.backends


def _attempt(deck: Jobdeck, job_id: int, worker: str = "w") -> JobContext:
    """Claim ``job_id`` (making it due first) and give its handler's context."""
    if deck.store.get(job_id).status is State.FAILED:
        deck.clock.advance(7200)  # type: ignore[attr-defined]  # past the backoff
    (job,) = deck.store.claim(worker, deck.clock(), limit=1)
    assert job.id == job_id
    return JobContext(deck.store, job.id, job.attempt, worker, job.type, deck.clock)


def _fail(deck: Jobdeck, ctx: JobContext) -> None:
    from jobdeck.store import Outcome

    deck.store.fail_many([Outcome(ctx.job_id, ctx.worker_id, attempt=ctx.attempt, error="boom")], deck.clock())


def _charges(deck: Jobdeck) -> dict[str, int]:
    with deck.store.read() as conn:
        return dict(conn.execute(select(demo_charges.c.order_id, func.count()).group_by(demo_charges.c.order_id)).all())


def test_done_is_returned_to_the_redelivery_without_running_again(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=3)
    calls: list[int] = []
    ctx = _attempt(deck, job.id)

    def charge() -> dict[str, Any]:
        calls.append(ctx.attempt)
        seen = deck.store.ledger.get("charge:o-1")
        assert seen.state is EffectState.STARTED and seen.attempt == 1 and seen.worker_id == "w"
        return {"charge_id": 7, "at": (1, 2)}

    assert ctx.effect("charge:o-1", charge) == {"charge_id": 7, "at": [1, 2]}
    done = deck.store.ledger.get("charge:o-1")
    assert done.state is EffectState.DONE and done.result == {"charge_id": 7, "at": [1, 2]} and done.finished_at
    _fail(deck, ctx)
    again = _attempt(deck, job.id)
    assert again.attempt == 2
    assert again.effect("charge:o-1", charge) == {"charge_id": 7, "at": [1, 2]}
    assert calls == [1]
    assert [e.key for e in deck.store.ledger.of_job(job.id)] == ["charge:o-1"]


def test_started_without_done_is_unknown_and_goes_dead(deck: Jobdeck) -> None:
    """The crash between the record and the effect: attempt 1 recorded the
    key and died. The retry must neither skip the charge nor make it again."""
    job, _ = deck.enqueue("demo.noop", max_retries=5)
    ctx = _attempt(deck, job.id)
    assert deck.store.ledger.start("charge:o-1", ctx.job_id, ctx.attempt, ctx.worker_id, deck.clock()).mine
    _fail(deck, ctx)  # the stalled sweep would record the same
    again = _attempt(deck, job.id)
    calls: list[int] = []
    with pytest.raises(EffectOutcomeUnknown) as caught:
        again.effect("charge:o-1", lambda: calls.append(1))
    assert str(caught.value) == "effect charge:o-1 was started by attempt 1 and its outcome is unknown"
    assert calls == [] and deck.store.ledger.get("charge:o-1").state is EffectState.STARTED


def test_an_exception_is_an_unknown_outcome_not_a_withdrawal(deck: Jobdeck) -> None:
    """A gateway timeout whose charge went through: the retry must not charge again."""
    job, _ = deck.enqueue("demo.noop", max_retries=5)
    ctx = _attempt(deck, job.id)

    def charge_then_time_out() -> None:
        FakeGateway(ctx).charge("o-1", 500)
        raise TimeoutError("gateway did not answer")

    with pytest.raises(TimeoutError):
        ctx.effect("charge:o-1", charge_then_time_out)
    assert deck.store.ledger.get("charge:o-1").state is EffectState.STARTED
    _fail(deck, ctx)
    with pytest.raises(EffectOutcomeUnknown):
        _attempt(deck, job.id).effect("charge:o-1", charge_then_time_out)
    assert _charges(deck) == {"o-1": 1}


def test_effect_not_performed_withdraws_the_key(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=5)
    ctx = _attempt(deck, job.id)

    def declined() -> None:
        raise EffectNotPerformed("card declined before any charge")

    with pytest.raises(EffectNotPerformed):
        ctx.effect("charge:o-1", declined)
    assert deck.store.ledger.get("charge:o-1").state is EffectState.NOT_PERFORMED
    _fail(deck, ctx)
    again = _attempt(deck, job.id)
    assert again.effect("charge:o-1", lambda: "charged") == "charged"
    record = deck.store.ledger.get("charge:o-1")
    assert (record.state, record.attempt, record.result) == (EffectState.DONE, 2, "charged")


def test_replay_safe_runs_again_with_the_key(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=5)
    ctx = _attempt(deck, job.id)
    keys: list[str] = []

    def timed_out(key: str) -> None:
        keys.append(key)
        raise TimeoutError("no answer")

    with pytest.raises(TimeoutError):
        ctx.effect("charge:o-1", timed_out, replay_safe=True)
    _fail(deck, ctx)
    again = _attempt(deck, job.id)
    assert again.effect("charge:o-1", lambda key: keys.append(key) or {"ok": key}, replay_safe=True) == {
        "ok": "charge:o-1"
    }
    assert keys == ["charge:o-1", "charge:o-1"]
    record = deck.store.ledger.get("charge:o-1")
    assert (record.state, record.attempt) == (EffectState.DONE, 2)


def test_the_worker_sends_an_unknown_outcome_to_dead_despite_retries(make_deck, registry: Registry) -> None:
    """Through the real pool: attempt 1's gateway call charges and times out;
    attempt 2 finds the effect started and the job dead-letters at once,
    with retries still left and exactly one charge made."""

    @registry.handler("test.charge", max_retries=5, backoff_base=0.01)
    def charge(payload: dict[str, Any], ctx: JobContext) -> Any:
        def call() -> None:
            FakeGateway(ctx).charge("o-1", 500)
            raise TimeoutError("gateway timed out")

        return ctx.effect("charge:o-1", call)

    deck = make_deck(backoff_base=0.01)
    job, _ = deck.enqueue("test.charge")
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.DEAD, message="the job to go dead")
    finally:
        pool.stop(grace=2)
    final = deck.store.get(job.id)
    assert final.retry_count == 1 and final.max_retries == 5
    assert final.error is not None and final.error.endswith(
        "effect charge:o-1 was started by attempt 1 and its outcome is unknown"
    )
    assert [a.outcome for a in deck.store.attempts_of(job.id)] == ["failed", "failed"]
    assert _charges(deck) == {"o-1": 1}


def test_two_attempts_racing_for_a_key_start_it_once(deck: Jobdeck) -> None:
    jobs = [deck.enqueue("demo.noop")[0] for _ in range(8)]
    claimed = deck.store.claim("w", deck.clock(), limit=8)
    barrier = threading.Barrier(len(claimed))
    mine: list[bool] = []

    def start(job_id: int, attempt: int) -> None:
        barrier.wait()
        mine.append(deck.store.ledger.start("charge:o-1", job_id, attempt, "w", deck.clock()).mine)

    threads = [threading.Thread(target=start, args=(j.id, j.attempt)) for j in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(jobs) == 8 and sorted(mine) == [False] * 7 + [True]


def test_another_jobs_running_attempt_is_waited_for(deck: Jobdeck) -> None:
    """Two jobs for one order at once: the second waits for the first's
    charge and returns its result, neither charging again nor going dead."""
    first, _ = deck.enqueue("demo.noop")
    second, _ = deck.enqueue("demo.noop")
    a, b = (
        JobContext(deck.store, j.id, j.attempt, "w", j.type, deck.clock)
        for j in deck.store.claim("w", deck.clock(), limit=2)
    )
    gate, inside = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def slow_charge() -> str:
        inside.set()
        gate.wait(10)
        return "charged once"

    runner = threading.Thread(target=lambda: got.setdefault("a", a.effect("charge:o-1", slow_charge)))
    runner.start()
    assert inside.wait(10)
    waiter = threading.Thread(target=lambda: got.setdefault("b", b.effect("charge:o-1", lambda: "charged twice")))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive(), "the second job did not wait for the first one's effect"
    gate.set()
    runner.join(timeout=10)
    waiter.join(timeout=10)
    assert got == {"a": "charged once", "b": "charged once"}
    assert {first.id, second.id} == {a.job_id, b.job_id}


def test_a_person_resolves_an_unknown_effect(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", max_retries=0)
    ctx = _attempt(deck, job.id)
    ledger = deck.store.ledger
    ledger.start("charge:o-1", ctx.job_id, ctx.attempt, "w", deck.clock())
    ledger.start("charge:o-2", ctx.job_id, ctx.attempt, "w", deck.clock())
    done = ledger.resolve("charge:o-1", EffectState.DONE, "alice", deck.clock(), result={"charge_id": "ch_1"})
    assert (done.state, done.resolved_by, done.result) == (EffectState.DONE, "alice", {"charge_id": "ch_1"})
    gone = ledger.resolve("charge:o-2", EffectState.NOT_PERFORMED, "alice", deck.clock())
    assert gone.state is EffectState.NOT_PERFORMED
    with pytest.raises(EffectResolveRefused, match="is done; only started effects"):
        ledger.resolve("charge:o-1", EffectState.NOT_PERFORMED, "bob", deck.clock())
    with pytest.raises(EffectNotFound):
        ledger.resolve("charge:nope", EffectState.DONE, "bob", deck.clock())
    with pytest.raises(ValueError):
        ledger.resolve("charge:o-1", EffectState.STARTED, "bob", deck.clock())
    # Then the retry: o-1 is skipped with the person's result, o-2 performed.
    _fail(deck, ctx)
    deck.store.retry(job.id, deck.clock())
    again = _attempt(deck, job.id)
    assert again.effect("charge:o-1", lambda: "again") == {"charge_id": "ch_1"}
    assert again.effect("charge:o-2", lambda: "performed") == "performed"


def test_results_are_made_storable() -> None:
    class Receipt:
        def __repr__(self) -> str:
            return "<Receipt ch_1>"

    deep: list[Any] = []
    for _ in range(100_000):  # past what repr can walk on any Python (3.13 walks 5,000)
        deep = [deep]
    assert storable({"a": "\x00€"}) == '{"a":"\\u0000€"}'
    assert storable(Receipt()) == '"<Receipt ch_1>"'
    assert storable(math.nan) == '"nan"'
    assert storable(deep) == '"<list that could not be stored>"'


def test_the_demo_gateway_honours_its_idempotency_key(deck: Jobdeck) -> None:
    ctx = JobContext(deck.store, 1, 1, "w", "demo.charge-card", deck.clock)
    gateway = FakeGateway(ctx)
    first = gateway.charge("o-1", 500, idempotency_key="charge:o-1")
    assert gateway.charge("o-1", 500, idempotency_key="charge:o-1") == {**first, "replayed": True}
    gateway.charge("o-2", 500)
    gateway.charge("o-2", 500)
    assert _charges(deck) == {"o-1": 1, "o-2": 2}


def test_once_still_works_and_says_it_is_deprecated(deck: Jobdeck) -> None:
    ctx = JobContext(deck.store, 1, 1, "w", "demo.noop", deck.clock)
    with pytest.deprecated_call():
        assert ctx.once("mail:1") is True
    with pytest.deprecated_call():
        assert ctx.once("mail:1") is False
    assert deck.store.ledger.get("mail:1").state is EffectState.DONE


def test_done_is_recorded_through_a_brief_outage(deck: Jobdeck, monkeypatch: pytest.MonkeyPatch) -> None:
    """The effect happened; a failed write of ``done`` must not turn it into
    an unknown outcome (a dead job for a person) when a retry can succeed."""
    from sqlalchemy.exc import OperationalError

    job, _ = deck.enqueue("demo.noop")
    ctx = _attempt(deck, job.id)
    real = deck.store.ledger.finish
    failures = iter([True, True])

    def flaky_finish(*args: Any) -> bool:
        if next(failures, False):
            raise OperationalError("UPDATE effects", {}, Exception("connection lost"))
        return real(*args)

    monkeypatch.setattr(deck.store.ledger, "finish", flaky_finish)
    assert ctx.effect("charge:o-1", lambda: "charged") == "charged"
    assert deck.store.ledger.get("charge:o-1").state is EffectState.DONE
