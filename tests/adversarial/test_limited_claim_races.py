"""The concurrency-limited claim under races (``test_limited_claim_hostile``
has the single-claim cases, ``test_limited_claim_killed`` the killed
connections): a randomized run checked claim by claim against a model of
the claim order, and threads of two decks racing under limits of one and
two."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.models import CLAIMABLE_STATES, jobs
from jobdeck.store.models import attempts as attempt_rows
from sqlalchemy import func, select

from tests.adversarial.limited_claims import (
    SLEEP,
    TYPES,
    Paths,
    done,
    ids,
    policy,
)
from tests.conftest import Clock

pytestmark = [pytest.mark.backends, pytest.mark.adversarial]


# -- a randomized run against a model of the claim ----------------------------------


class Model:
    """What a limited claim must take, from the jobs as they stand: the due
    jobs in claim order (priority DESC, available_at, id), but for paused
    queues, those of the filter's types and queues only, each taken unless
    its type or queue is at its limit."""

    def __init__(self, types: dict[str, int], queues: dict[str, int]) -> None:
        self.types, self.queues = types, queues

    def expect(
        self,
        rows: list[Any],
        paused: set[str],
        now: datetime,
        limit: int,
        types: list[str] | None,
        queues: list[str] | None,
        done: set[int] = frozenset(),  # type: ignore[assignment]
    ) -> list[int]:
        running = [r for r in rows if r.status == "running" and r.id not in done]
        left_t = {t: n - sum(r.type == t for r in running) for t, n in self.types.items()}
        left_q = {q: n - sum(r.queue == q for r in running) for q, n in self.queues.items()}
        due = sorted(
            (r for r in rows if r.status in CLAIMABLE_STATES and _aware(r.available_at) <= now),
            key=lambda r: (-r.priority, _aware(r.available_at), r.id),
        )
        chosen: list[int] = []
        for r in due:
            if len(chosen) >= limit:
                break
            if r.queue in paused or (types is not None and r.type not in types):
                continue
            if queues is not None and r.queue not in queues:
                continue
            if left_t.get(r.type, 1) <= 0 or left_q.get(r.queue, 1) <= 0:
                continue
            chosen.append(r.id)
            if r.type in left_t:
                left_t[r.type] -= 1
            if r.queue in left_q:
                left_q[r.queue] -= 1
        return chosen


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _rows(deck: Jobdeck) -> list[Any]:
    cols = (jobs.c.id, jobs.c.type, jobs.c.queue, jobs.c.priority, jobs.c.available_at, jobs.c.status)
    with deck.store.read() as conn:
        return list(conn.execute(select(*cols)).all())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_limited_claims_take_what_the_model_takes(
    make_deck: Callable[..., Jobdeck], seed: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two decks (two policies, each with its own guess) enqueue, claim
    with random filters and limits, complete (alone and in refills), pause
    and resume queues and let time pass; every claim is checked against
    ``Model`` computed from the jobs just before it (with a refill's
    completions applied), and no limit is ever exceeded."""
    rng = random.Random(seed)
    paths = Paths(monkeypatch)
    clock = Clock()
    type_limits, queue_limits = {"demo.sleep": 1, "demo.report": 2}, {"reports": 2}
    decks = [make_deck(clock=clock), make_deck(clock=clock)]
    policies = [policy(d, types=type_limits, queues=queue_limits) for d in decks]
    model = Model(type_limits, queue_limits)
    held: dict[int, JobRecord] = {}
    paused: set[str] = set()
    claims = 0
    for _ in range(140):
        deck = rng.choice(decks)
        op = rng.random()
        if op < 0.35:
            delay = rng.choice([None, None, None, 0.5, 2.0])
            deck.enqueue(
                rng.choice(TYPES),
                SLEEP,
                queue=rng.choice(["default", "reports", "bulk"]),
                priority=rng.choice([0, 0, 1, 2]),
                delay_seconds=delay,
            )
            continue
        if op < 0.42:
            queue = rng.choice(["reports", "bulk"])
            pause = queue not in paused
            rng.choice(policies).set_paused(queue, pause, clock.now, "test")
            (paused.add if pause else paused.discard)(queue)
            continue
        if op < 0.47:
            clock.advance(rng.choice([0.3, 1.0, 1.0, 30.0]))
            continue
        if op < 0.52 and held:
            failing = held.pop(rng.choice(sorted(held)))
            failed = deck.store.fail_many(
                [Outcome(failing.id, failing.worker_id or "w", attempt=failing.attempt, error="boom")], clock.now
            )
            assert [j.id for j in failed] == [failing.id]
            continue
        limit = rng.choice([1, 1, 2, 3, 5])
        types = rng.choice([None, None, TYPES, ["demo.sleep", "demo.noop"], ["demo.report"], ["demo.noop"]])
        queues = rng.choice([None, None, None, ["reports"], ["default", "bulk"]])
        finishing = rng.sample(sorted(held), k=min(len(held), rng.choice([0, 1, 1, 2, 3])))
        rows = _rows(deck)
        expected = model.expect(rows, paused, clock.now, limit, types, queues, done=set(finishing))
        if finishing and rng.random() < 0.7:
            outcomes = [done(held[i], held[i].worker_id or "w") for i in finishing]
            accepted, claimed = deck.store.complete_and_claim(
                outcomes, "w", clock.now, limit=limit, types=types, queues=queues
            )
            assert sorted(accepted) == sorted(finishing)
        else:
            if finishing:
                outcomes = [done(held[i], held[i].worker_id or "w") for i in finishing]
                assert sorted(deck.store.complete_many(outcomes, clock.now)) == sorted(finishing)
                rows = _rows(deck)
                expected = model.expect(rows, paused, clock.now, limit, types, queues)
            claimed = deck.store.claim("w", clock.now, limit=limit, types=types, queues=queues)
        for i in finishing:
            del held[i]
        claims += 1
        assert ids(claimed) == expected, (
            f"claim {claims} (limit {limit}, types {types}, queues {queues}, paused {sorted(paused)}, "
            f"finishing {finishing}): took {ids(claimed)}, the model takes {expected}"
        )
        held.update({j.id: j for j in claimed})
        after = _rows(deck)
        for name, n in type_limits.items():
            assert sum(r.type == name and r.status == "running" for r in after) <= n
        for name, n in queue_limits.items():
            assert sum(r.queue == name and r.status == "running" for r in after) <= n
    print(f"seed {seed}: {claims} claims checked against the model; {paths.check(backend)}")


# -- threads of two decks racing under the limits -------------------------------------


@pytest.mark.parametrize("shape", ["plain", "chains"])
def test_threads_of_two_decks_never_exceed_the_limits_nor_claim_a_job_twice(
    make_deck: Callable[..., Jobdeck], backend: str, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """Six threads over two decks claim (plain and in refills) jobs of a
    type limited to one and a queue limited to two, holding each a moment.
    A sampler reads the running counts in single statements; each thread
    counts what it holds between a claim's return and its completion's
    start (both bounded by the database's running count). Every job runs
    once, completes once, and every accepted id is reported once.
    ``chains``: workflows a -> b -> c whose steps are limited, so refills
    complete workflow jobs (the fallback after the batch) under contention."""
    paths = Paths(monkeypatch)
    decks = [make_deck(), make_deck()]
    for d in decks:
        policy(d, types={"demo.sleep": 1}, queues={"reports": 2})
    total = 0
    if shape == "plain":
        for i in range(150):
            kind = ["demo.sleep", "demo.noop", "demo.noop"][i % 3]
            decks[0].enqueue(kind, SLEEP, queue="reports" if i % 4 == 0 else "default", priority=i % 2)
            total += 1
    else:
        for i in range(40):
            wf = decks[0].workflow(f"chain{i}").add("a", "demo.noop", queue="reports")
            wf.add("b", "demo.sleep", SLEEP, depends_on=["a"], priority=i % 2)
            wf.add("c", "demo.noop", depends_on=["b"], queue="reports" if i % 2 else "default").enqueue()
            total += 3
    lock = threading.Lock()
    holding = {"demo.sleep": 0, "reports": 0}
    worst = {"demo.sleep": 0, "reports": 0}
    accepted_all: list[int] = []
    claimed_all: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    deadline = time.monotonic() + 25

    def note(claimed: list[JobRecord], sign: int) -> None:
        with lock:
            for j in claimed:
                for key, hit in (("demo.sleep", j.type == "demo.sleep"), ("reports", j.queue == "reports")):
                    if hit:
                        holding[key] += sign
                        worst[key] = max(worst[key], holding[key])

    def worker(deck: Jobdeck, name: str, seed: int) -> None:
        rng = random.Random(seed)
        mine: list[JobRecord] = []
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                finishing, mine = mine, []
                note(finishing, -1)
                now = datetime.now(UTC)
                outcomes = [done(j, name) for j in finishing]
                limit = rng.choice([1, 2, 4])
                types = rng.choice([None, ["demo.sleep", "demo.noop"]])
                if outcomes and rng.random() < 0.8:
                    accepted, claimed = deck.store.complete_and_claim(outcomes, name, now, limit=limit, types=types)
                else:
                    accepted = deck.store.complete_many(outcomes, now) if outcomes else []
                    claimed = deck.store.claim(name, now, limit=limit, types=types)
                assert sorted(accepted) == sorted(j.id for j in finishing)
                note(claimed, +1)
                with lock:
                    accepted_all.extend(accepted)
                    claimed_all.extend(j.id for j in claimed)
                    if len(accepted_all) >= total:
                        stop.set()
                mine = claimed
                if not claimed and not finishing:
                    time.sleep(0.005)  # nothing due for this thread yet: poll again
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            stop.set()

    sampled = {"demo.sleep": 0, "reports": 0}

    def sampler() -> None:
        stmt = select(
            func.count().filter(jobs.c.type == "demo.sleep"), func.count().filter(jobs.c.queue == "reports")
        ).where(jobs.c.status == "running")
        while not stop.is_set():
            with decks[1].store.read() as conn:
                sleeps, reports = conn.execute(stmt).one()
            sampled["demo.sleep"] = max(sampled["demo.sleep"], sleeps)
            sampled["reports"] = max(sampled["reports"], reports)

    threads = [threading.Thread(target=worker, args=(decks[i % 2], f"w{i}", i), daemon=True) for i in range(6)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    assert worst["demo.sleep"] <= 1 and sampled["demo.sleep"] <= 1, (worst, sampled)
    assert worst["reports"] <= 2 and sampled["reports"] <= 2, (worst, sampled)
    assert len(claimed_all) == len(set(claimed_all)) == total, "a job claimed twice, or one never claimed"
    assert sorted(accepted_all) == sorted(claimed_all), "accepted ids differ from the jobs run"
    rows = _rows(decks[0])
    assert {r.status for r in rows} == {"completed"}
    with decks[0].store.read() as conn:
        attempts = conn.execute(select(attempt_rows.c.job_id, func.count()).group_by(attempt_rows.c.job_id)).all()
    assert len(attempts) == total and all(n == 1 for _, n in attempts), "a job with other than one attempt row"
    print(f"{total} jobs, worst held: {worst}, worst sampled: {sampled}; {paths.check(backend)}")
