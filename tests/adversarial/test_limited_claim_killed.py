"""The concurrency-limited claim with its connection killed or cancelled
(``test_limited_claim_hostile`` has the single-claim cases): while waiting
for the claim lock, in the fallback claim of a refill, and a plain claim;
each raises a SQLAlchemy error and applies nothing, and the next try works."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy.exc
from jobdeck.deck import Jobdeck
from jobdeck.store import controls, postgres
from sqlalchemy import text

from tests.adversarial.limited_claims import (
    POSTGRES_ONLY,
    completed_attempts,
    done,
    ids,
    policy,
    schema_name,
)
from tests.conftest import Clock, wait_for

pytestmark = [pytest.mark.backends, pytest.mark.adversarial]


# -- killed and cancelled connections -------------------------------------------------


def _backend_waiting_on_advisory_lock(schema: str) -> int | None:
    from tests.pgtest import admin_engine

    engine = admin_engine()
    try:
        with engine.connect() as conn:
            pid = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = :name "
                    "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                ),
                {"name": schema},
            ).scalar()
            return None if pid is None else int(pid)
    finally:
        engine.dispose()


def _signal(pid: int, how: str) -> None:
    from tests.pgtest import admin_engine

    engine = admin_engine()
    try:
        with engine.connect() as conn:
            fn = "pg_terminate_backend" if how == "terminate" else "pg_cancel_backend"
            assert conn.execute(text(f"SELECT {fn}(:pid)"), {"pid": pid}).scalar() is True
    finally:
        engine.dispose()


def _signalled_waiting_for_the_lock(deck: Jobdeck, call: Callable[[], Any], how: str) -> dict[str, Any]:
    """Run ``call`` in a thread while another session holds the limited
    claims' advisory lock; once its backend waits for the lock, signal it
    (``how``: terminate or cancel), then release the lock. What ``call``
    answered (``result``) or raised (``error``)."""
    from tests.pgtest import admin_engine

    holder = admin_engine()
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["result"] = call()
        except BaseException as exc:
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    try:
        with holder.connect() as lock_conn:
            lock_conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": postgres.CLAIM_LOCK})
            lock_conn.commit()
            thread.start()
            try:
                pid = wait_for(lambda: _backend_waiting_on_advisory_lock(schema_name(deck)), timeout=10)
                _signal(pid, how)
                thread.join(timeout=10)
            finally:
                lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": postgres.CLAIM_LOCK})
                lock_conn.commit()
    finally:
        holder.dispose()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the call still waits after its backend was signalled"
    return got


@POSTGRES_ONLY
@pytest.mark.parametrize("how", ["terminate", "cancel"])
def test_a_refill_killed_waiting_for_the_claim_lock_applies_nothing(
    make_deck: Callable[..., Jobdeck], how: str
) -> None:
    """The refill's batch completes a job, then waits for the limited
    claims' advisory lock (held here from another session); its backend
    is terminated (or its statement cancelled) there. The refill raises a
    SQLAlchemy error and nothing of it is applied: the job is still
    running, with no attempt row; the same refill again then applies it
    once and claims, and the deck's pool works on."""

    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    a, _ = deck.enqueue("demo.noop")
    [job] = deck.store.claim("w1", clock.now, limit=1, types=types)
    assert job.id == a.id
    nxt, _ = deck.enqueue("demo.noop")
    got = _signalled_waiting_for_the_lock(
        deck, lambda: deck.store.complete_and_claim([done(job)], "w1", clock.now, limit=5, types=types), how
    )
    assert "result" not in got, f"the refill answered {got.get('result')} though its backend was {how}d"
    assert isinstance(got["error"], sqlalchemy.exc.SQLAlchemyError), repr(got["error"])
    assert deck.store.get(a.id).status == "running"
    assert completed_attempts(deck, a.id) == 0
    assert deck.store.get(nxt.id).status == "pending"
    accepted, claimed = deck.store.complete_and_claim([done(job)], "w1", clock.now, limit=5, types=types)
    assert accepted == [a.id]
    assert ids(claimed) == [nxt.id]
    assert completed_attempts(deck, a.id) == 1


@POSTGRES_ONLY
def test_a_refill_killed_in_its_fallback_claim_applies_nothing(
    make_deck: Callable[..., Jobdeck], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill completes a workflow step (which the batch's statement
    leaves to the fallback) and a plain job; its connection is terminated
    just as the fallback's picked claim starts, after the completions were
    landed in the transaction. The refill raises a SQLAlchemy error and
    neither completion, nor the step's promotion, survives."""
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    wf = deck.workflow("chain").add("a", "demo.noop").add("b", "demo.noop", depends_on=["a"]).enqueue()
    plain, _ = deck.enqueue("demo.noop")
    claimed = deck.store.claim("w1", clock.now, limit=5, types=types)
    assert ids(claimed) == [wf.jobs["a"], plain.id]
    original = controls._Claim.picked
    killed: list[int] = []

    def killing(claim: Any, conn: Any, *args: Any) -> Any:
        if not killed:
            pid = conn.connection.driver_connection.info.backend_pid
            killed.append(pid)
            _signal(pid, "terminate")
        return original(claim, conn, *args)

    monkeypatch.setattr(controls._Claim, "picked", killing)
    with pytest.raises(sqlalchemy.exc.SQLAlchemyError):
        deck.store.complete_and_claim([done(j) for j in claimed], "w1", clock.now, limit=5, types=types)
    assert killed, "the fallback claim did not run"
    monkeypatch.setattr(controls._Claim, "picked", original)
    for j in claimed:
        assert deck.store.get(j.id).status == "running"
        assert completed_attempts(deck, j.id) == 0
    assert deck.store.get(wf.jobs["b"]).status == "blocked", "the step's promotion outlived its rolled-back cause"
    accepted, refill = deck.store.complete_and_claim([done(j) for j in claimed], "w1", clock.now, limit=5, types=types)
    assert sorted(accepted) == sorted(ids(claimed))
    assert ids(refill) == [wf.jobs["b"]]
    for j in claimed:
        assert completed_attempts(deck, j.id) == 1


@POSTGRES_ONLY
def test_a_claim_cancelled_waiting_for_the_lock_leaves_the_pool_usable(make_deck: Callable[..., Jobdeck]) -> None:
    """A plain limited claim (no refill) is cancelled while its batch waits
    for the advisory lock: it raises a SQLAlchemy error, claims nothing,
    and the next claims on the same deck (the same pooled connections)
    work and take the jobs in claim order."""

    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    jobs_ = [deck.enqueue("demo.noop")[0].id for _ in range(3)]
    got = _signalled_waiting_for_the_lock(deck, lambda: deck.store.claim("w1", clock.now, limit=1), "cancel")
    assert isinstance(got.get("error"), sqlalchemy.exc.SQLAlchemyError), got
    assert [deck.store.get(i).status for i in jobs_] == ["pending"] * 3
    for expected in jobs_:
        assert ids(deck.store.claim("w1", clock.now + timedelta(seconds=1), limit=1)) == [expected]
