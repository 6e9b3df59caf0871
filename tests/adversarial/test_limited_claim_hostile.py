"""Hostile tests of the concurrency-limited claim, and of PostgreSQL's
pipelined try of it (``jobdeck.store.controls._Claim.pipelined``): the
completions of a refill, the advisory lock, the running counts and a plain
claim without what the last claim found blocked (``controls.Blocked``), in
one batch, kept only when the guess still holds.

Here: a refill whose completions free a limited slot or promote a limited
step, rolled-back tries and the completions before them, duplicate and late
outcomes, and stale guesses (a type or queue freed, a queue paused or
resumed by another deck, whose policy has a guess of its own). Races and
a randomized run against a model are in ``test_limited_claim_races``,
killed connections in ``test_limited_claim_killed``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.models import jobs
from sqlalchemy import func, select

from tests.adversarial.limited_claims import (
    SLEEP,
    completed_attempts,
    done,
    ids,
    policy,
)
from tests.conftest import Clock

pytestmark = [pytest.mark.backends, pytest.mark.adversarial]


# -- a refill whose completions free a limited slot ---------------------------------


@pytest.mark.parametrize("limit", ["type", "queue"])
def test_a_refill_claims_the_limited_step_its_completion_promoted(
    make_deck: Callable[..., Jobdeck], limit: str
) -> None:
    """A chain a -> b of the same limited type (or queue), limit 1: the
    refill that completes a frees the only slot and promotes b, so the same
    refill must claim b. The pipelined try counts the running jobs before
    the workflow completions land (they are not in its batch's statement),
    so it reads a as still running and skips b."""
    clock = Clock()
    deck = make_deck(clock=clock)
    if limit == "type":
        policy(deck, types={"demo.sleep": 1})
    else:
        policy(deck, queues={"default": 1})
    types = ["demo.sleep", "demo.noop"]
    wf = deck.workflow("chain").add("a", "demo.sleep", SLEEP).add("b", "demo.sleep", SLEEP, depends_on=["a"]).enqueue()
    [a] = deck.store.claim("w1", clock.now, limit=10, types=types)
    assert a.id == wf.jobs["a"]
    accepted, refill = deck.store.complete_and_claim([done(a)], "w1", clock.now, limit=10, types=types)
    assert accepted == [a.id]
    assert deck.store.get(a.id).status == "completed"
    assert ids(refill) == [wf.jobs["b"]], "the step promoted by the refill's completion, within the limit, was skipped"


@pytest.mark.parametrize("group", ["workflow", "batch"])
def test_a_refill_completing_a_grouped_limited_job_frees_its_slot_for_a_waiting_job(
    make_deck: Callable[..., Jobdeck], group: str
) -> None:
    """A limited job in a workflow (or a batch) is running at the limit of
    one, another job of its type waits. The refill that completes it must
    claim the waiting one: nothing is over the limit once the completion
    landed, which the same transaction's claim must see."""
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    if group == "workflow":
        first = deck.workflow("one").add("a", "demo.sleep", SLEEP).enqueue().jobs["a"]
    else:
        with deck.batch(name="one") as batch:
            first = batch.add("demo.sleep", SLEEP)
    [a] = deck.store.claim("w1", clock.now, limit=10, types=types)
    assert a.id == first
    waiting, _ = deck.enqueue("demo.sleep", SLEEP)
    assert deck.store.claim("w1", clock.now, limit=10, types=types) == []  # at the limit
    accepted, refill = deck.store.complete_and_claim([done(a)], "w1", clock.now, limit=10, types=types)
    assert accepted == [a.id]
    assert ids(refill) == [waiting.id], "the refill freed the limited slot but did not claim the job waiting for it"


def test_a_limited_refill_claims_the_batch_callback_its_completion_enqueued(make_deck: Callable[..., Jobdeck]) -> None:
    """The last job of a closed batch completes in a limited refill: its
    callback job is enqueued by that completion (which the batch's
    statement leaves to the fallback), and the same refill claims it."""
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    with deck.batch(on_complete="demo.noop", name="one") as batch:
        member = batch.add("demo.noop")
    [job] = deck.store.claim("w1", clock.now, limit=5, types=types)
    assert job.id == member
    accepted, refill = deck.store.complete_and_claim([done(job)], "w1", clock.now, limit=5, types=types)
    assert accepted == [member]
    assert len(refill) == 1 and refill[0].payload["batch"]["callback"] == "on_complete"


def test_a_rolled_back_try_keeps_the_completions_sent_before_it(make_deck: Callable[..., Jobdeck]) -> None:
    """The refill's try takes two jobs of a type limited to one: it is
    rolled back to its savepoint, which must not undo the completion sent
    in the same batch before it; the picked claim then takes the first due
    of the type and the other type's job, and the second sleep stays
    pending."""
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    s1, _ = deck.enqueue("demo.sleep", SLEEP)
    [held] = deck.store.claim("w1", clock.now, limit=1, types=types)
    assert held.id == s1.id
    s2, _ = deck.enqueue("demo.sleep", SLEEP)
    s3, _ = deck.enqueue("demo.sleep", SLEEP)
    n1, _ = deck.enqueue("demo.noop")
    # The last claim found demo.sleep full: the guess excludes it, the counts (after s1's completion) do not.
    accepted, refill = deck.store.complete_and_claim([done(held)], "w1", clock.now, limit=5, types=types)
    assert accepted == [s1.id]
    assert deck.store.get(s1.id).status == "completed"
    assert completed_attempts(deck, s1.id) == 1
    assert ids(refill) == [s2.id, n1.id]
    assert deck.store.get(s3.id).status == "pending"
    # Again, now with a guess of nothing blocked: the try takes s3 and more, over the limit once s2 runs.
    n2, _ = deck.enqueue("demo.noop")
    n3, _ = deck.enqueue("demo.noop")
    [s2_job] = [j for j in refill if j.id == s2.id]
    [n1_job] = [j for j in refill if j.id == n1.id]
    accepted, refill = deck.store.complete_and_claim([done(n1_job)], "w1", clock.now, limit=5, types=types)
    assert accepted == [n1.id]
    assert ids(refill) == [n2.id, n3.id]
    assert deck.store.get(s3.id).status == "pending"
    accepted, refill = deck.store.complete_and_claim([done(s2_job)], "w1", clock.now, limit=5, types=types)
    assert accepted == [s2.id]
    assert ids(refill) == [s3.id]
    for job_id in (s1.id, s2.id, n1.id):
        assert completed_attempts(deck, job_id) == 1


def test_duplicate_and_late_outcomes_in_a_limited_refill_apply_once(make_deck: Callable[..., Jobdeck]) -> None:
    """A refill's outcomes name one job twice and another at an attempt it
    no longer runs (a late result): the first completes once, with one
    attempt row, and is reported once; the late one is refused and left
    running; the claim still takes the next due job."""
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, types={"demo.sleep": 2})
    types = ["demo.sleep", "demo.noop"]
    a, _ = deck.enqueue("demo.noop")
    b, _ = deck.enqueue("demo.sleep", SLEEP)
    claimed = deck.store.claim("w1", clock.now, limit=2, types=types)
    assert ids(claimed) == [a.id, b.id]
    job_a, job_b = claimed
    nxt, _ = deck.enqueue("demo.sleep", SLEEP)
    late = Outcome(job_b.id, "w1", attempt=job_b.attempt + 1)
    accepted, refill = deck.store.complete_and_claim(
        [done(job_a), done(job_a), late], "w1", clock.now, limit=5, types=types
    )
    assert accepted == [a.id]
    assert completed_attempts(deck, a.id) == 1
    assert deck.store.get(b.id).status == "running"
    assert ids(refill) == [nxt.id]


# -- stale guesses ------------------------------------------------------------------


def test_a_type_freed_by_another_deck_is_claimed_in_claim_order(make_deck: Callable[..., Jobdeck]) -> None:
    """Deck 1's policy remembers demo.sleep as full; deck 2 (another
    process's policy, with a guess of its own) completes the running sleep.
    Deck 1's next claim must take the waiting sleep first, in claim order."""
    clock = Clock()
    one, two = make_deck(clock=clock), make_deck(clock=clock)
    policy(one, types={"demo.sleep": 1})
    policy(two, types={"demo.sleep": 1})
    types = ["demo.sleep", "demo.noop"]
    deck = one
    deck.enqueue("demo.sleep", SLEEP)
    [held] = one.store.claim("w1", clock.now, limit=1, types=types)
    waiting, _ = deck.enqueue("demo.sleep", SLEEP, priority=5)
    n1, _ = deck.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [n1.id]  # guess: demo.sleep full
    assert two.store.complete_many([done(held)], clock.now) == [held.id]
    n2, _ = deck.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [waiting.id]
    assert ids(one.store.claim("w1", clock.now, limit=5, types=types)) == [n2.id]


@pytest.mark.parametrize("types", [["demo.sleep", "demo.noop"], None])
def test_a_queue_freed_since_the_last_claim_is_claimed_in_claim_order(
    make_deck: Callable[..., Jobdeck], types: list[str] | None
) -> None:
    clock = Clock()
    deck = make_deck(clock=clock)
    policy(deck, queues={"reports": 1})
    deck.enqueue("demo.noop", queue="reports")
    [held] = deck.store.claim("w1", clock.now, limit=1, types=types)
    first, _ = deck.enqueue("demo.noop", queue="reports", priority=3)
    second, _ = deck.enqueue("demo.noop", queue="reports", priority=3)
    other, _ = deck.enqueue("demo.noop")
    assert ids(deck.store.claim("w1", clock.now, limit=1, types=types)) == [other.id]  # guess: reports skipped
    accepted, refill = deck.store.complete_and_claim([done(held)], "w1", clock.now, limit=5, types=types)
    assert accepted == [held.id]
    assert ids(refill) == [first.id]  # one: the queue's limit
    assert deck.store.get(second.id).status == "pending"


@pytest.mark.parametrize("types", [["demo.sleep", "demo.noop"], None])
def test_a_queue_resumed_by_another_deck_is_not_skipped(
    make_deck: Callable[..., Jobdeck], types: list[str] | None
) -> None:
    """Deck 1's last claim skipped the paused queue (its guess); deck 2
    resumes it. Deck 1's next claim must take the resumed queue's job,
    ahead of a later one."""
    clock = Clock()
    one, two = make_deck(clock=clock), make_deck(clock=clock)
    policy(one, types={"demo.sleep": 1})
    resumer = policy(two, types={"demo.sleep": 1})
    resumer.set_paused("reports", True, clock.now, "test")
    held, _ = one.enqueue("demo.noop", queue="reports")
    n1, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [n1.id]
    resumer.set_paused("reports", False, clock.now, "test")
    clock.advance(1)
    n2, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [held.id]
    assert ids(one.store.claim("w1", clock.now, limit=5, types=types)) == [n2.id]


@pytest.mark.parametrize("types", [["demo.sleep", "demo.noop"], None])
def test_a_queue_paused_by_another_deck_is_skipped_at_once(
    make_deck: Callable[..., Jobdeck], types: list[str] | None
) -> None:
    """The guess says nothing is blocked; deck 2 pauses a queue. Deck 1's
    try (which does not exclude it) must not keep a claim from it."""
    clock = Clock()
    one, two = make_deck(clock=clock), make_deck(clock=clock)
    policy(one, types={"demo.sleep": 1})
    pauser = policy(two, types={"demo.sleep": 1})
    first, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [first.id]
    pauser.set_paused("reports", True, clock.now, "test")
    paused, _ = one.enqueue("demo.noop", queue="reports", priority=9)
    n1, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=5, types=types)) == [n1.id]
    assert one.store.get(paused.id).status == "pending"


def test_a_type_filled_by_another_deck_is_not_claimed_over_its_limit(make_deck: Callable[..., Jobdeck]) -> None:
    """Deck 1's guess says nothing is full; deck 2 claims the type to its
    limit. Deck 1's try takes a sleep; it must be rolled back."""
    clock = Clock()
    one, two = make_deck(clock=clock), make_deck(clock=clock)
    policy(one, types={"demo.sleep": 2})
    policy(two, types={"demo.sleep": 2})
    types = ["demo.sleep", "demo.noop"]
    n0, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=1, types=types)) == [n0.id]  # guess: nothing full
    sleeps = [one.enqueue("demo.sleep", SLEEP)[0].id for _ in range(3)]
    assert ids(two.store.claim("w2", clock.now, limit=2, types=types)) == sleeps[:2]
    n1, _ = one.enqueue("demo.noop")
    assert ids(one.store.claim("w1", clock.now, limit=5, types=types)) == [n1.id]
    assert _running(one, "demo.sleep") == 2


def _running(deck: Jobdeck, job_type: str) -> int:
    with deck.store.read() as conn:
        stmt = select(func.count()).where(jobs.c.type == job_type, jobs.c.status == "running")
        return int(conn.execute(stmt).scalar_one())
