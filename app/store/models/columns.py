"""What every table is built from: the UTC time type, the id type, the
metadata every table is defined on, and the state lists the partial indexes
and the store's statements share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobdeck.core.states import (
    State,
    Transition,
    sources,
)
from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Integer,
    MetaData,
    literal_column,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; UTC in the database (naive on SQLite)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use UTC-aware times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


# SQLite only makes INTEGER PRIMARY KEY the rowid; PostgreSQL gets BIGINT.
BigID = BigInteger().with_variant(Integer(), "sqlite")


def status_in(status: Any, states: list[str]) -> ColumnElement[bool]:
    """``status IN ('a', 'b')`` with the states written literally, not bound:
    SQLite uses a partial index only when it can see that a WHERE implies the
    index's own, which it cannot through parameters."""
    return status.in_([literal_column(f"'{s}'") for s in states])  # type: ignore[no-any-return]


CLAIMABLE_STATES = sources(Transition.CLAIM)
"""The states a due job is claimed from; ``jobdeck.store.statements.claimable``
adds the due time. The claim indexes hold only these rows."""
ERROR_STATES = [State.FAILED.value, State.DEAD.value]
"""The states whose jobs are grouped by error (``ix_jobs_error_groups`` holds only these)."""
FLOW_KEY_COLUMNS = ("rate_key", "concurrency_key")

metadata = MetaData()
"""Every table (``jobdeck.store.models``); the migrations compare against it."""
