"""Hostile snoozes: raw JSON an HTTP worker may send to
``POST /api/jobs/<id>/snooze`` (infinities, NUL bytes, deep and huge
bodies), and handlers that snooze in ways no one should (a reason full of
NUL bytes, a megabyte of reason, a subclass whose ``__str__`` raises, a
snooze from a thread that is told to stop). Each is a clear 4xx or a
stored, readable attempt; never a 500, a dead executor or a job left
running. On SQLite and PostgreSQL (where a NUL in text is a DataError)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.core.validation import MAX_JSON_DEPTH
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry, Snooze
from jobdeck.jobs.snooze import MAX_REASON_CHARS
from jobdeck.runtime import pool_for

from tests.conftest import Clock, wait_for

pytestmark = pytest.mark.backends


def _claimed(client: Any, deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop")
    client.post("/api/jobs/claim", json={"worker_id": "hw"})
    return job.id


RAW_BODIES = [
    '{"worker_id": "hw", "seconds": 1e999}',
    '{"worker_id": "hw", "seconds": -1e999}',
    '{"worker_id": "hw", "seconds": NaN}',
    '{"worker_id": "hw", "seconds": Infinity}',
    '{"worker_id": "hw", "seconds": 99999999999999999999999999999999999999999}',
    '{"worker_id": "hw", "seconds": [30]}',
    '{"worker_id": "hw", "seconds": {"s": 30}}',
    '{"worker_id": "hw", "seconds": null}',
    '{"worker_id": "hw", "seconds": "\\u0000"}',
    '{"worker_id": "hw\\u0000", "seconds": 1}',
    '{"worker_id": "hw", "seconds": 1, "reason": "a\\u0000b"}',
    '{"worker_id": "hw", "seconds": 1, "reason": "\\ud800"}',
    '{"worker_id": "hw", "seconds": 1, "reason": ' + "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "}",
    '{"worker_id": "hw", "seconds": 1, "reason": "' + "x" * (MAX_REASON_CHARS + 1) + '"}',
    "[1, 2, 3]",
    '"seconds"',
    "",
]


@pytest.mark.parametrize("raw", RAW_BODIES, ids=range(len(RAW_BODIES)))
def test_hostile_snooze_bodies_are_refused_clearly(client: Any, deck: Jobdeck, raw: str) -> None:
    job_id = _claimed(client, deck)
    r = client.post(f"/api/jobs/{job_id}/snooze", data=raw, content_type="application/json")
    assert 400 <= r.status_code < 500, (r.status_code, r.get_data(as_text=True)[:300])
    assert r.mimetype == "application/json" and r.get_json()["error"]
    job = deck.store.get(job_id)
    assert job.status is State.RUNNING and deck.store.attempts_of(job_id) == []


def test_a_huge_snooze_body_is_refused_before_parsing(client: Any, deck: Jobdeck) -> None:
    job_id = _claimed(client, deck)
    body = json.dumps({"worker_id": "hw", "seconds": 1, "pad": "x" * (8 * 1024 * 1024)})
    r = client.post(f"/api/jobs/{job_id}/snooze", data=body, content_type="application/json")
    assert r.status_code == 413 and r.get_json()["error"]


class Unprintable(Snooze):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def _hostile_handlers(registry: Registry) -> None:
    registry.handler("t.nul")(lambda p, ctx: Snooze(5, "bad\x00reason\x00"))
    registry.handler("t.megabyte")(lambda p, ctx: ctx.snooze(5, "r" * 1_000_000))
    registry.handler("t.unprintable")(lambda p, ctx: (_ for _ in ()).throw(Unprintable(5)))
    registry.handler("t.reason-object")(lambda p, ctx: Snooze(5, {"deep": [[[[]]]]}))  # type: ignore[arg-type]


@pytest.mark.parametrize("job_type", ["t.nul", "t.megabyte", "t.unprintable", "t.reason-object"])
def test_hostile_handler_snoozes_are_stored_readably(make_deck: Any, registry: Registry, job_type: str) -> None:
    _hostile_handlers(registry)
    clock = Clock()
    deck = make_deck(clock=clock)
    job, _ = deck.enqueue(job_type, max_retries=0)
    pool = pool_for(deck, 1)
    assert pool.fetch_once() == 1
    pool.run_job(pool.holdings.work.get_nowait())
    pool.flush_acks_once()
    after = deck.store.get(job.id)
    assert after.status is State.PENDING and after.retry_count == 0
    (row,) = deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.SNOOZED and row.snooze_seconds == 5
    assert row.error is not None and row.error.startswith("snoozed for 5 s")
    assert "\x00" not in row.error and len(row.error) <= MAX_REASON_CHARS + 40


def test_a_pool_keeps_running_after_hostile_snoozes(live_deck: Jobdeck, registry: Registry) -> None:
    """Real threads: bad delays, unreadable subclasses and NUL reasons fail
    or snooze their attempts; the executors survive and run the next job."""
    _hostile_handlers(registry)
    registry.handler("t.nan")(lambda p, ctx: ctx.snooze(float("nan")))
    ids = [live_deck.enqueue(t, max_retries=0)[0].id for t in ("t.nan", "t.nul", "t.unprintable")]
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: all(live_deck.store.attempts_of(i) for i in ids), message="each attempt recorded")
        last, _ = live_deck.enqueue("demo.noop")
        wait_for(lambda: live_deck.store.get(last.id).status is State.COMPLETED, message="the pool still runs jobs")
    finally:
        pool.stop(grace=2)
    assert live_deck.store.get(ids[0]).status is State.DEAD
    assert live_deck.store.attempts_of(ids[0])[0].error == "InvalidSnooze: snooze seconds must be a finite number"
