"""The threshold alerts' state (``threshold_alerts``): which are firing,
and the compare-and-set that moves one between firing and clear, so that of
several processes checking at once exactly one sends each start and each
recovery. ``jobdeck.maintenance.thresholds`` decides what is breached."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from jobdeck.store.models import threshold_alerts
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select, update

if TYPE_CHECKING:
    from jobdeck.store import Store

_KEY_CHARS = 400
"""The length of ``threshold_alerts.key``: a longer key is stored as its hash."""


@dataclass(frozen=True)
class ThresholdState:
    key: str
    firing: bool
    changed_at: datetime
    value: float | None


def threshold_states(store: Store) -> dict[str, ThresholdState]:
    """Every threshold alert the database has seen, by stored key."""
    with store.read() as conn:
        rows = conn.execute(select(threshold_alerts)).all()
    return {r.key: ThresholdState(r.key, bool(r.firing), r.changed_at, r.value) for r in rows}


def threshold_state(store: Store, key: str) -> ThresholdState | None:
    """Alert ``key``'s state now (None for a key never seen): the delivery
    of a message compares it with the move the message describes."""
    with store.read() as conn:
        r = conn.execute(select(threshold_alerts).where(threshold_alerts.c.key == stored_key(key))).first()
    return None if r is None else ThresholdState(r.key, bool(r.firing), r.changed_at, r.value)


def move_threshold(store: Store, key: str, firing: bool, now: datetime, value: float | None) -> bool:
    """Move alert ``key`` to ``firing`` (True) or clear (False) if it is not
    there yet; True for the one caller that moved it. A key never seen is
    clear: clearing it moves nothing."""
    key = stored_key(key)
    with store.write() as conn:
        moved = conn.execute(
            update(threshold_alerts)
            .where(threshold_alerts.c.key == key, threshold_alerts.c.firing == (not firing))
            .values(firing=firing, changed_at=now, value=value)
            .returning(threshold_alerts.c.key)
        ).first()
        if moved is not None or not firing:
            return moved is not None
        # RETURNING, not rowcount: PostgreSQL's ON CONFLICT DO NOTHING reports -1 either way.
        inserted = conn.execute(
            dialect_insert(store.dialect)(threshold_alerts)
            .values(key=key, firing=True, changed_at=now, value=value)
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(threshold_alerts.c.key)
        ).first()
    return inserted is not None


def stored_key(key: str) -> str:
    if len(key) <= _KEY_CHARS:
        return key
    kind = key.split(":", 1)[0][:40]
    return f"{kind}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"
