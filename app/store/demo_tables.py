"""The demo handlers' own tables: the outbox ``demo.send-email`` writes to
and the charges of the fake payment gateway ``demo.charge-card`` calls
(``jobdeck.demo``). Real handlers keep their side effects in their own systems;
these tables let the demo show at-least-once delivery and the effects
ledger against something a person can count.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from jobdeck.store.models import demo_charges, demo_outbox
from jobdeck.store.statements import dialect_insert
from sqlalchemy import insert, select

if TYPE_CHECKING:
    from jobdeck.store import Store


def send_demo_email(store: Store, user_id: str, job_id: int, body: str, now: datetime) -> None:
    """Put one message in the outbox (every call sends: no key)."""
    with store.write() as conn:
        conn.execute(insert(demo_outbox).values(user_id=user_id, job_id=job_id, body=body, sent_at=now))


def record_demo_charge(
    store: Store, order_id: str, amount_cents: int, job_id: int, now: datetime, idempotency_key: str | None = None
) -> tuple[int, bool]:
    """Charge once; returns (charge id, replayed). Like a real gateway's key,
    ``idempotency_key`` makes a second charge return the first one
    (replayed True) instead of charging again; without it every call charges."""
    values = {
        "order_id": order_id,
        "amount_cents": amount_cents,
        "job_id": job_id,
        "charged_at": now,
        "idempotency_key": idempotency_key,
    }
    with store.write() as conn:
        if idempotency_key is None:
            return conn.execute(insert(demo_charges).values(values).returning(demo_charges.c.id)).scalar_one(), False
        charge_id = conn.execute(
            dialect_insert(store.dialect)(demo_charges)
            .values(values)
            .on_conflict_do_nothing(index_elements=["idempotency_key"])
            .returning(demo_charges.c.id)
        ).scalar()
        if charge_id is not None:
            return charge_id, False
        first = conn.execute(select(demo_charges.c.id).where(demo_charges.c.idempotency_key == idempotency_key))
        return first.scalar_one(), True
