"""An idempotent enqueue whose key's job is deleted (retention) between the
insert that found the key taken and the read of that job: PostgreSQL reads
each statement afresh, so the read found nothing and the enqueue failed with
a 500. It must insert the job instead: the key is free again."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.models import jobs
from sqlalchemy import delete, event

pytestmark = [pytest.mark.backends, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def test_a_key_freed_mid_enqueue_gets_a_new_job(deck: Jobdeck, make_deck: Any) -> None:
    old, _ = deck.enqueue("demo.noop", {"n": 1}, idempotency_key="order-1")
    pruner = make_deck()  # retention in another process
    fired: list[int] = []

    def after_execute(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if not fired and statement.lstrip().upper().startswith("INSERT INTO JOBS"):
            fired.append(1)
            with pruner.store.write() as other:
                other.execute(delete(jobs).where(jobs.c.id == old.id))

    event.listen(deck.store.engine, "after_cursor_execute", after_execute)
    try:
        job, created = deck.enqueue("demo.noop", {"n": 1}, idempotency_key="order-1")
    finally:
        event.remove(deck.store.engine, "after_cursor_execute", after_execute)
    assert fired, "the key's job was not deleted mid-enqueue"
    assert created and job.id != old.id and job.status is State.PENDING
    assert deck.store.get(job.id).idempotency_key == "order-1"
