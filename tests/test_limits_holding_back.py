"""Whether a concurrency limit holds claims back now
(``QueueControls.holding_back``): the pool's acker claims in its
completions' transaction only then. A limit on a type the claims do not
meet (the demo's on ``demo.charge-card`` while a drain of other jobs runs)
leaves the pool claiming as if none were configured; the first claim of a
limited job, or one that finds a limit full, turns the hold back on, and
the limit holds throughout."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.runtime import pool_for

from tests.conftest import all_in, wait_for
from tests.helpers import completions

pytestmark = pytest.mark.backends

SERVED = ["demo.noop", "demo.sleep"]


def test_the_hold_follows_what_the_last_claim_met(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    controls = deck.queues
    assert controls.holding_back(), "no claim yet: nothing says the limit is quiet"
    deck.enqueue_many([{"type": "demo.noop"}] * 3)
    claimed = deck.store.claim("w", clock(), limit=2, types=SERVED)
    assert [j.type for j in claimed] == ["demo.noop"] * 2
    assert not controls.holding_back(), "the claim took no limited job and found no limit full"

    first, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    took = deck.store.claim("w", clock(), limit=5, types=SERVED)
    assert first.id in {j.id for j in took}
    assert controls.holding_back(), "the claim took a job of the limited type"

    second, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    assert deck.store.claim("w", clock(), limit=5, types=SERVED) == []
    assert controls.holding_back(), "the claim found the limit full"

    deck.store.complete_many(completions([j for j in took if j.id == first.id], "w"), clock())
    (next_one,) = deck.store.claim("w", clock(), limit=5, types=SERVED)
    assert next_one.id == second.id and controls.holding_back()

    deck.store.complete_many(completions([next_one], "w"), clock())
    deck.enqueue("demo.noop")
    assert [j.type for j in deck.store.claim("w", clock(), limit=5, types=SERVED)] == ["demo.noop"]
    assert not controls.holding_back(), "the limited jobs are done: quiet again"

    controls.set_paused("elsewhere", True, clock(), "test")
    deck.enqueue("demo.noop")
    assert deck.store.claim("w", clock(), limit=5, types=SERVED)
    assert not controls.holding_back(), "a paused queue alone holds nothing back"


def test_a_concurrency_per_key_always_holds(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    """A key's next job is claimable at its last one's end: the flow claim
    has no quiet state to tell, so the hold stays on."""
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1, "concurrency_key": "payload.k"}})
    deck.enqueue_many([{"type": "demo.noop"}] * 2)
    assert deck.store.claim("w", clock(), limit=5, types=SERVED)
    assert deck.queues.holding_back()


def test_a_pool_claims_beside_its_acker_until_a_limited_job_comes(make_deck, registry, backend) -> None:  # type: ignore[no-untyped-def]
    """A real pool with a limit of one on a type: a drain of other jobs,
    then limited jobs, then other jobs again. The limit holds throughout
    (never two limited jobs running at once). On PostgreSQL the acker
    claims in its completions' transaction only while limited jobs come:
    none of the first drain's cycles does, and the limited phase's do."""
    running, most, lock = [0], [0], threading.Lock()

    def limited(payload: Any, ctx: Any) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            threading.Event().wait(0.02)
        finally:
            with lock:
                running[0] -= 1

    registry.handler("t.limited")(limited)
    deck = make_deck(types={"t.limited": {"concurrency": 1}})
    pool = pool_for(deck, 4)
    refills = [0]
    complete_and_claim = deck.store.complete_and_claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        refills[0] += 1
        return complete_and_claim(*args, **kwargs)

    deck.store.complete_and_claim = counted  # type: ignore[method-assign]

    def drain(ids: list[int], what: str) -> int:
        before = refills[0]
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED]), timeout=60, message=what)
        return refills[0] - before

    pool.start()
    try:
        quiet = drain(deck.enqueue_many([{"type": "demo.noop"}] * 300), "the first drain")
        held = drain(deck.enqueue_many([{"type": "t.limited"}] * 6), "the limited jobs")
        drain(deck.enqueue_many([{"type": "demo.noop"}] * 300), "the second drain")
    finally:
        pool.stop(grace=5)
    assert most[0] == 1, f"{most[0]} limited jobs ran at once under a limit of 1"
    if backend == "postgres":
        assert quiet == 0, f"{quiet} cycles of the first drain claimed in the acker's transaction"
        assert held > 0, "no cycle of the limited phase claimed in the completions' transaction"
    assert not deck.queues.holding_back(), "the last claims took no limited job: quiet again"


def test_a_quiet_claim_takes_a_limited_job_in_its_turn(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    """While the claims are quiet, PostgreSQL's claim takes the jobs it
    picks without the limits' lock only if none of them is limited; a
    limited job among them (here at the head of the line, by priority)
    sends it to the limit-aware claim, which takes it first, in claim order."""
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    deck.enqueue("demo.noop")
    assert deck.store.claim("w", clock(), limit=1, types=SERVED) and not deck.queues.holding_back()
    low, _ = deck.enqueue("demo.noop")
    limited, _ = deck.enqueue("demo.sleep", {"seconds": 60}, priority=5)
    later, _ = deck.enqueue("demo.noop")
    claimed = deck.store.claim("w", clock(), limit=2, types=SERVED)
    assert [j.id for j in claimed] == [limited.id, low.id]
    assert deck.store.get(later.id).status is State.PENDING


def test_a_quiet_claim_holds_a_limit_another_process_filled(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    """Two processes, each with its own policy. The first's claims are
    quiet; the second then fills the limit. The first still believes it
    quiet, picks the second limited job and must not take it: it takes the
    other jobs, in claim order, and the limited one stays pending."""
    limits = {"demo.sleep": {"concurrency": 1}}
    first, second = make_deck(clock=clock, types=limits), make_deck(clock=clock, types=limits)
    first.enqueue("demo.noop")
    assert first.store.claim("w1", clock(), limit=1, types=SERVED) and not first.queues.holding_back()
    held, _ = first.enqueue("demo.sleep", {"seconds": 60}, priority=9)
    assert [j.id for j in second.store.claim("w2", clock(), limit=1, types=SERVED)] == [held.id]
    waiting, _ = first.enqueue("demo.sleep", {"seconds": 60}, priority=9)
    noops = [first.enqueue("demo.noop")[0].id for _ in range(2)]
    claimed = first.store.claim("w1", clock(), limit=3, types=SERVED)
    assert [j.id for j in claimed] == noops
    assert first.store.get(waiting.id).status is State.PENDING
    assert first.queues.holding_back(), "it found the limit full"


def test_a_quiet_claim_leaves_the_jobs_of_a_limited_queue_to_the_limit(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    """A queue's limit counts as a type's does: a quiet claim that picks a
    job of the limited queue takes it only through the limit-aware claim,
    and never past the limit."""
    deck = make_deck(clock=clock, queues={"slow": {"concurrency": 1}})
    deck.enqueue("demo.noop")
    assert deck.store.claim("w", clock(), limit=1) and not deck.queues.holding_back()
    a, _ = deck.enqueue("demo.noop", queue="slow")
    b, _ = deck.enqueue("demo.noop", queue="slow")
    other, _ = deck.enqueue("demo.noop")
    claimed = deck.store.claim("w", clock(), limit=5)
    assert [j.id for j in claimed] == [a.id, other.id]
    assert deck.store.get(b.id).status is State.PENDING


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_quiet_claim_locks_no_job_it_does_not_take(make_deck, clock, backend) -> None:  # type: ignore[no-untyped-def]
    """Found by the hostile review: the quiet claim locked the jobs it
    picked, a limited one included, even when it took none; a claim beside
    it skipped them (``SKIP LOCKED``) and took the ones behind. It reads the
    head of the line (twice its limit) without a lock now: refusing, it
    locks nothing; taking, it locks only the first of the head's jobs no
    other claimer holds, and never reaches past the head. Each claim is held open in a transaction here,
    and another connection looks at what it locked."""
    import psycopg

    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    url = deck.store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    unless = (["demo.sleep"], [])

    def free(ids: list[int]) -> list[int]:
        with psycopg.connect(url, autocommit=True) as other:
            got = other.execute("SELECT id FROM jobs WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED", (ids,)).fetchall()
            return sorted(r[0] for r in got)

    limited, _ = deck.enqueue("demo.sleep", {"seconds": 60}, priority=9)
    noop, _ = deck.enqueue("demo.noop")
    with deck.store.write() as conn:
        assert deck.store.claim_in(conn, "w", clock(), 5, None, None, [], unless=unless) == []
        assert free([limited.id, noop.id]) == sorted([limited.id, noop.id]), "a refusing claim locked jobs"
        conn.rollback()
    assert deck.store.claim("w", clock(), limit=5)  # both, by the limit-aware claim

    ids = [deck.enqueue("demo.noop")[0].id for _ in range(5)]  # limit 2: the head is the first 2 x 2
    for held, taken in (([ids[0]], ids[1:3]), (ids[:3], ids[3:4])):
        with psycopg.connect(url) as other:
            other.execute("SELECT id FROM jobs WHERE id = ANY(%s) FOR UPDATE", (held,))  # another claimer's
            with deck.store.write() as conn:
                took = deck.store.claim_in(conn, "w", clock(), 2, None, None, [], unless=unless)
                assert [j.id for j in took] == taken, "not the first free jobs of the head, or past it"
                left = [i for i in ids if i not in held + taken]
                assert free(left) == left, "it locked a job it did not take"
                conn.rollback()
            other.rollback()


def test_a_claim_of_no_type_or_from_no_queue_claims_nothing(make_deck, clock) -> None:  # type: ignore[no-untyped-def]
    """Found by the hostile review (older than the quiet claim): an empty
    type or queue list left an uncompiled placeholder in the claim's
    statement, and the claim failed. The HTTP claim refuses one before it
    gets here; the store's claim now answers it with nothing, with limits
    configured or not."""
    for limits in ({}, {"types": {"demo.sleep": {"concurrency": 1}}}):
        deck = make_deck(clock=clock, **limits)
        deck.enqueue_many([{"type": "demo.noop"}, {"type": "demo.sleep", "payload": {"seconds": 60}}])
        assert deck.store.claim("w", clock(), limit=5, types=[]) == []
        assert deck.store.claim("w", clock(), limit=5, queues=[]) == []
        took = deck.store.claim("w", clock(), limit=5)
        assert sorted(j.type for j in took) == ["demo.noop", "demo.sleep"]
        deck.store.complete_many(completions(took, "w"), clock())


def test_the_hold_reads_no_database(make_deck, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The acker asks before every cycle, outside the writes it retries
    through an outage: a read there that failed would end the acker's
    thread. The hold answers from what the last claim found, the paused
    queues as it read them included, even with their cache stale."""
    from jobdeck.store import controls

    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    deck.enqueue("demo.noop")
    assert deck.store.claim("w", clock(), limit=1, types=SERVED)

    def down(store):  # type: ignore[no-untyped-def]
        raise ConnectionError("the database is down")

    monkeypatch.setattr(controls, "paused_queues", down)
    deck.queues._read_at = None  # the paused queues' cache stale: a read would be due
    assert not deck.queues.holding_back()
