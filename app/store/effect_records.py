"""What the effects ledger keeps of an effect, as the job side reads it: a
record of its row, and a result as the JSON text the row holds. Apart from
the ledger's SQL (``jobdeck.store.ledger``), so that a process executor's
child, which runs handlers and never touches the database, reads them
without loading SQLAlchemy and the tables (most of its start-up's CPU)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobdeck.core.states import EffectState

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def storable(value: Any) -> str:
    """``value`` as the JSON text the ledger keeps. A value JSON cannot hold
    exactly (an object, NaN, a cycle, nesting too deep) is kept as its
    ``repr``: the effect happened, so its record must be written whatever
    the function returned. JSON escapes NUL, so PostgreSQL accepts it."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return _ENCODER.encode(repr(value))
    except Exception:  # a __repr__ that raises, or recursion again: still record the effect
        return _ENCODER.encode(f"<{type(value).__name__} that could not be stored>")


@dataclass(frozen=True)
class EffectRecord:
    key: str
    state: EffectState
    job_id: int | None
    attempt: int | None
    worker_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result_json: str | None
    resolved_by: str | None

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)

    @property
    def unknown(self) -> bool:
        return self.state is EffectState.STARTED

    @classmethod
    def from_row(cls, row: Any) -> EffectRecord:
        m = row._mapping
        return cls(
            key=m["key"],
            state=EffectState(m["state"]),
            job_id=m["job_id"],
            attempt=m["attempt"],
            worker_id=m["worker_id"],
            created_at=m["created_at"],
            started_at=m["started_at"],
            finished_at=m["finished_at"],
            result_json=m["result"],
            resolved_by=m["resolved_by"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state.value,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "worker_id": self.worker_id,
            "created_at": self.created_at.isoformat(),
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "result": self.result,
            "resolved_by": self.resolved_by,
        }


__all__ = ["EffectRecord", "storable"]
