"""Review of d68ffc3: claims other than the plain one, which still stamp the
time read before their last statement reached PostgreSQL.

The fix made ``statements.claim`` voidable (``on_time``), but a claim under
limits ends with another UPDATE of the jobs: ``statements.claim_ids``
(concurrency limits, ``controls._Claim.picked``) or
``statements.claim_ids_logging`` (flow limits, ``flow_pipelined.claim_flow``).
Both take ``now`` (re-read by ``after_waiting`` *before* they are sent, not
as they land), so a final UPDATE held on a lock of the jobs table (or resent
by TCP after a partition) stamps an HTTP worker's job already stalled.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from jobdeck import create_app
from jobdeck.core.clock import DatabaseClock

from tests.adversarial.test_late_landing import ON_POSTGRES, STALL, _job, held_on_a_lock


def _held_claim(deck: Any, request: Any, client: Any, body: dict[str, Any]) -> Any:
    return held_on_a_lock(
        deck, request.node.pg_schema, "LOCK TABLE jobs IN SHARE MODE", {},
        lambda: client.post("/api/jobs/claim", json=body).get_json(), STALL,
    )  # fmt: skip


def _judge(deck: Any, job_id: int, held: Any) -> None:
    status, beat = _job(deck, job_id)
    now = deck.clock()
    print(f"claimed job's heartbeat {beat.isoformat()}, {(now - beat).total_seconds():.2f} s old at once; "
          f"lock released at {held.released.isoformat()}")  # fmt: skip
    rescued = [r.id for r in deck.store.rescue_stalled(now, STALL)]
    assert job_id not in rescued, f"job {job_id}, claimed a moment ago, was rescued as stalled ({rescued})"
    assert beat >= held.released - timedelta(seconds=0.5), "the claim stamped the time read before it landed"


@ON_POSTGRES
def test_a_claim_beside_a_full_concurrency_limit_that_lands_late_is_not_stalled_at_once(
    make_deck: Any, request: Any
) -> None:
    """A type at its concurrency limit: the pipelined batch sends no plain
    claim (``_send_plain`` returns None when ``types`` is None and a type is
    full), so the claim is ``picked``: the due read, then ``claim_ids`` with
    ``now``, which waits on the table lock past ``stall_timeout``."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5, types={"demo.sleep": {"concurrency": 1}})
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    limited = deck.enqueue("demo.sleep", {}).job.id
    assert client.post("/api/jobs/claim", json={"worker_id": "busy"}).get_json()["id"] == limited
    assert client.post("/api/jobs/claim", json={"worker_id": "busy"}).get_json() is None  # learns demo.sleep is full
    job_id = deck.enqueue("demo.noop", {}).job.id

    held = _held_claim(deck, request, client, {"worker_id": "ext"})
    assert held.answer is not None and held.answer["id"] == job_id, "the worker holds the job"
    _judge(deck, job_id, held)


@ON_POSTGRES
def test_a_rate_limited_claim_whose_last_statement_lands_late_is_not_stalled_at_once(
    make_deck: Any, request: Any
) -> None:
    """A flow (rate) limit: the reads go in the first batch, then
    ``after_waiting`` re-reads the clock, then ``claim_ids_logging`` is sent
    and waits on the table lock past ``stall_timeout``."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5, types={"demo.noop": {"rate": "100/1s"}})
    assert isinstance(deck.clock, DatabaseClock)
    client = create_app(deck=deck).test_client()
    job_id = deck.enqueue("demo.noop", {}).job.id

    held = _held_claim(deck, request, client, {"worker_id": "ext"})
    assert held.answer is not None and held.answer["id"] == job_id, "the worker holds the job"
    _judge(deck, job_id, held)


@ON_POSTGRES
def test_a_plain_claim_with_types_queues_and_a_paused_queue_lands_late_not_stalled(
    make_deck: Any, request: Any
) -> None:
    """Sanity of the voidable statement's parameter order (void_at after
    the type, queue and excluded-queue lists and the limit)."""
    deck = make_deck(stall_timeout=STALL, heartbeat_interval=0.5)
    assert isinstance(deck.clock, DatabaseClock)
    app = create_app(deck=deck)
    client = app.test_client()
    deck.enqueue("demo.noop", {}, queue="held")
    assert client.post("/api/queues/held/pause", json={}).status_code in (200, 201)
    job_id = deck.enqueue("demo.noop", {}).job.id

    held = _held_claim(
        deck, request, client, {"worker_id": "ext", "types": ["demo.noop", "demo.fail"], "queues": ["default", "held"]}
    )
    assert held.answer is not None and held.answer["id"] == job_id, "the worker holds the job"
    _judge(deck, job_id, held)
