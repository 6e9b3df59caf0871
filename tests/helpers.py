"""Test-only helpers (kept out of conftest so modules can import them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from app.deck import Jobdeck
from app.states import State
from app.store.models import jobs


def force_state(deck: Jobdeck, job_id: int, state: State, worker_id: str | None = "w1", **values: Any) -> None:
    """Put a job straight into a state, to test transitions out of it.
    (Only tests write a status without a transition.)"""
    fields: dict[str, Any] = {"status": state.value, "worker_id": worker_id, **values}
    if state is State.RUNNING:
        fields.setdefault("attempt", 1)
        fields.setdefault("heartbeat_at", deck.clock())
        fields.setdefault("claimed_at", deck.clock())
    with deck.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(fields))


def settle_failures(deck: Jobdeck, *job_ids: int) -> dict[int, State]:
    """Run a real pool until every job has failed once (``failed`` or
    ``dead``); their states."""
    from app.worker.pool import WorkerPool
    from tests.conftest import wait_for

    pool = WorkerPool(deck, 2)
    pool.start()
    try:
        wait_for(
            lambda: all(deck.store.get(i).status in (State.FAILED, State.DEAD) for i in job_ids),
            message="every job failed once",
        )
    finally:
        pool.stop(grace=5)
    return {i: deck.store.get(i).status for i in job_ids}
