"""Siblings completed at the same instant on two engines (two processes'
pools: on PostgreSQL separate connections, where SQLite's one writer cannot
hide the race), round after round: their join is promoted exactly once and
never missed, and a batch whose last jobs end together fires once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.models import jobs
from sqlalchemy import func, select

pytestmark = pytest.mark.backends

ROUNDS = 20
SIBLINGS = 4


def _race(decks: list[Jobdeck], claimed: list[Any], finish: Callable[[Jobdeck, Any], Any]) -> list[str]:
    """One thread per claimed job, released together; each finishes its job on the deck it claimed it with."""
    barrier = threading.Barrier(len(claimed), timeout=30)
    errors: list[str] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            finish(decks[i % 2], claimed[i])
        except BaseException as exc:  # every error is the failure this test reports
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,), name=f"sibling-{i}") for i in range(len(claimed))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a completing thread hung"
    return errors


def _claim_each(decks: list[Jobdeck], n: int) -> list[Any]:
    """``n`` due jobs, one claim each, alternately by the two decks' workers."""
    got = []
    for i in range(n):
        (job,) = decks[i % 2].store.claim(f"w{i % 2}", decks[i % 2].clock(), limit=1)
        got.append(job)
    return got


def test_siblings_completed_at_once_promote_their_join_exactly_once(make_deck: Callable[..., Jobdeck]) -> None:
    decks = [make_deck(), make_deck()]
    for r in range(ROUNDS):
        build = decks[0].workflow(f"fan-{r}").add("root", "demo.noop")
        for s in range(SIBLINGS):
            build.add(f"s{s}", "demo.noop", depends_on=["root"])
        wf = build.add("join", "demo.noop", depends_on=[f"s{s}" for s in range(SIBLINGS)]).enqueue()
        (root,) = _claim_each(decks, 1)
        decks[0].store.complete_many([Outcome(root.id, "w0", attempt=root.attempt)], decks[0].clock())
        siblings = _claim_each(decks, SIBLINGS)
        assert sorted(j.step for j in siblings) == [f"s{s}" for s in range(SIBLINGS)]

        def complete(deck: Jobdeck, job: Any) -> None:
            worker = "w0" if deck is decks[0] else "w1"
            assert deck.store.complete_many([Outcome(job.id, worker, attempt=job.attempt)], deck.clock()) == [job.id]

        errors = _race(decks, siblings, complete)
        assert errors == [], f"round {r}: {errors}"
        join = decks[1].store.get(wf.jobs["join"])
        assert (join.status, join.deps_left) == (State.PENDING, 0), f"round {r}: the join is {join.status}"
        (claimed,) = decks[1].store.claim("w1", decks[1].clock(), limit=10)
        assert claimed.id == join.id
        decks[1].store.complete_many([Outcome(join.id, "w1", attempt=claimed.attempt)], decks[1].clock())
        assert decks[0].store.workflow(wf.id).workflow.state == "completed"


def test_the_last_jobs_of_a_batch_ended_at_once_fire_it_once(make_deck: Callable[..., Jobdeck]) -> None:
    decks = [make_deck(), make_deck()]
    for r in range(ROUNDS):
        batch = decks[0].batch(on_complete={"type": "demo.noop", "payload": {"round": r}})
        ids = batch.add_many([{"type": "demo.noop", "payload": {"n": i}} for i in range(SIBLINGS)])
        batch.close()
        claimed = _claim_each(decks, SIBLINGS)
        assert sorted(j.id for j in claimed) == ids

        def end(deck: Jobdeck, job: Any) -> None:
            worker = "w0" if deck is decks[0] else "w1"
            if job.payload["n"] == SIBLINGS - 1:  # one dies: the batch ends with a completion and a failure racing
                deck.store.fail_many(
                    [Outcome(job.id, worker, attempt=job.attempt, error="x", retryable=False)], deck.clock()
                )
            else:
                deck.store.complete_many([Outcome(job.id, worker, attempt=job.attempt)], deck.clock())

        errors = _race(decks, claimed, end)
        assert errors == [], f"round {r}: {errors}"
        with decks[0].store.read() as conn:
            callbacks = conn.execute(select(func.count()).where(jobs.c.batch_id.is_(None))).scalar_one()
        assert callbacks == r + 1, f"round {r}: {callbacks} callbacks enqueued in {r + 1} rounds"
        record = decks[0].store.batch(batch.id)
        assert record.outcome is not None and record.outcome["counts"] == {"completed": SIBLINGS - 1, "dead": 1}
        for deck in decks:  # the callback, claimed and done, so the next round's claims see only its batch
            for job in deck.store.claim("cb", deck.clock(), limit=10):
                deck.store.complete_many([Outcome(job.id, "cb", attempt=job.attempt)], deck.clock())
