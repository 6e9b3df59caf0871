"""Transitions racing each other on several connections (two engines, as two
processes): claims, batched and single completions and failures, late
results, heartbeats, the stalled sweep and operator retries, all at once.

The property test (test_store_state_machine.py) checks every answer against
a model, one call at a time; this one checks what must hold however the
calls interleave: an attempt ends once (one attempt row per attempt number),
a job is completed once and only by its current attempt, the retry budget
holds, and no call fails with anything but a refusal.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.errors import NotHeld, TransitionRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.store.models import attempts, jobs
from jobdeck.store.records import Outcome
from sqlalchemy import select

from tests.conftest import T0, Clock

pytestmark = pytest.mark.backends

JOBS = 120
RUN_FOR = 3.0
"""Seconds of racing per backend, at least."""
RACE_DEADLINE = 30.0
"""Past RUN_FOR the race goes on until every way to end an attempt has
happened (a late result the sweeper reaches first is the rare one), and
gives up at this deadline."""
WAYS_TO_END = {"completed", "failed", "stalled"}
CLAIM_AT = T0 + timedelta(hours=2)
SWEEP_AT = T0 + timedelta(hours=3)
"""The sweep's clock runs an hour ahead of the claims', so every running job
looks stalled to it: it races every completion."""


def ended_so_far(deck: Jobdeck) -> set[str]:
    with deck.store.read() as conn:
        return set(conn.execute(select(attempts.c.outcome).distinct()).scalars())


def test_racing_transitions_end_each_attempt_once(make_deck: Callable[..., Jobdeck], backend: str) -> None:
    decks = [make_deck(clock=Clock()), make_deck(clock=Clock())]
    QueueControls(decks[1].store, Limits(queues={"default": 3}, types={})).install()
    decks[0].enqueue_many([{"type": "demo.noop", "max_retries": 3} for _ in range(JOBS)])
    stop = threading.Event()
    errors: list[str] = []
    late: list[Outcome] = []
    lock = threading.Lock()

    def guarded(name: str, body: Callable[[random.Random], None]) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(name)
            while not stop.is_set():
                try:
                    body(rng)
                except (TransitionRefused, NotHeld):
                    pass
                except BaseException as exc:  # every other error is the failure this test reports
                    errors.append(f"{name}: {exc!r}")
                    return

        return run

    def worker(worker_id: str, deck: Jobdeck) -> Callable[[random.Random], None]:
        store = deck.store

        def body(rng: random.Random) -> None:
            claimed = store.claim(worker_id, CLAIM_AT, limit=rng.choice([1, 3, 5]))
            done: list[Outcome] = []
            for job in claimed:
                outcome = Outcome(job.id, worker_id, attempt=job.attempt)
                how = rng.random()
                if how < 0.4:
                    done.append(outcome)
                elif how < 0.55:  # the HTTP worker's calls: what they answer is what happened
                    record = store.complete(job.id, worker_id, CLAIM_AT)
                    assert record.status is State.COMPLETED, f"complete answered {record.status}"
                elif how < 0.65:
                    record = store.fail(job.id, worker_id, "boom", CLAIM_AT)
                    assert record.status in (State.FAILED, State.DEAD), f"fail answered {record.status}"
                    assert record.attempt == job.attempt, f"fail landed on attempt {record.attempt}, not {job.attempt}"
                elif how < 0.8:
                    outcome.error = "boom"
                    store.fail_many([outcome], CLAIM_AT)
                else:
                    with lock:
                        late.append(outcome)  # reported later, by then rescued or re-claimed
            with lock:
                stale = [late.pop(rng.randrange(len(late))) for _ in range(min(len(late), rng.choice([0, 1, 2])))]
            if done or stale:
                store.complete_and_claim(done + stale, worker_id, CLAIM_AT, limit=0)

        return body

    def sweeper(rng: random.Random) -> None:
        decks[rng.randrange(2)].store.rescue_stalled(SWEEP_AT, stall_timeout=60)

    def heartbeats(rng: random.Random) -> None:
        decks[rng.randrange(2)].store.heartbeat_worker(rng.choice(["w1", "w2"]), CLAIM_AT)

    def operator(rng: random.Random) -> None:
        store = decks[rng.randrange(2)].store
        store.retry_ids([rng.randrange(1, JOBS * 2) for _ in range(5)], CLAIM_AT)
        stop.wait(0.01)  # an operator clicks now and then, not in a busy loop; the stop ends the pause at once

    threads = [
        threading.Thread(target=guarded(name, body), name=name)
        for name, body in [
            ("w1", worker("w1", decks[0])),
            ("w2", worker("w2", decks[1])),
            ("sweeper", sweeper),
            ("heartbeats", heartbeats),
            ("operator", operator),
        ]
    ]
    for t in threads:
        t.start()
    stop.wait(RUN_FOR)
    deadline = time.monotonic() + RACE_DEADLINE
    while not errors and time.monotonic() < deadline and not ended_so_far(decks[0]) >= WAYS_TO_END:
        stop.wait(0.2)
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    assert not errors, errors

    with decks[0].store.read() as conn:
        job_rows = {r.id: r for r in conn.execute(select(jobs))}
        rows_of: dict[int, list[Any]] = {}
        for a in conn.execute(select(attempts).order_by(attempts.c.id)):
            rows_of.setdefault(a.job_id, []).append(a)
    assert len(job_rows) == JOBS
    finished = 0
    for job in job_rows.values():
        rows = rows_of.get(job.id, [])
        numbers = [a.attempt for a in rows]
        assert len(numbers) == len(set(numbers)), (
            f"job {job.id}: an attempt ended twice: {[(a.attempt, a.outcome) for a in rows]}"
        )
        assert all(n <= job.attempt for n in numbers), f"job {job.id}: a row for an attempt never claimed"
        completed = [a for a in rows if a.outcome == "completed"]
        assert len(completed) == (job.status == State.COMPLETED.value), f"job {job.id} is {job.status}: {completed}"
        if completed:
            assert completed[0].attempt == job.attempt, f"job {job.id} completed by an old attempt"
            finished += 1
        assert job.retry_count <= job.max_retries
    assert finished, "nothing completed: the race did not run"
    outcomes = {a.outcome for rows in rows_of.values() for a in rows}
    assert outcomes >= WAYS_TO_END, f"the race missed a way to end: {outcomes}"
