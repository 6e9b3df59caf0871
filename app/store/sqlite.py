"""SQLite at driver level: the store's own Core statements compiled to text
once, the times as SQLite stores them, and the commit watcher's probe.

Building a Core statement, computing its cache key and running the
``UTCDateTime`` processors costs more per call than SQLite needs to do the
work, so the hot statements (claim, batched completions, attempt rows,
plain enqueues) are compiled from ``jobdeck.store.statements`` once per
parameter shape and run with positional parameters, and their rows are
decoded here (``JobRecord.from_sqlite``). There is no second copy of any
statement: the text is whatever Core renders for SQLite.

Times are stored as SQLAlchemy's SQLite ``DATETIME`` writes them (naive UTC,
``YYYY-MM-DD HH:MM:SS.ffffff``), so text comparisons with rows written
through Core stay correct.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from operator import itemgetter
from typing import Any

from jobdeck.core.states import State
from sqlalchemy.dialects.sqlite import dialect as _sqlite_dialect
from sqlalchemy.exc import DBAPIError

_UTC = UTC
_DIALECT = _sqlite_dialect(paramstyle="qmark")
STATE_OF = {s.value: s for s in State}


def db_time(value: datetime) -> str:
    """An aware time as the text SQLAlchemy's SQLite DATETIME stores."""
    if value.tzinfo is _UTC:  # the clock's own times: cut the offset off (a tenth of the acker's Python time)
        return value.isoformat(" ", "microseconds")[:26]
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the database; use UTC-aware times")
    return value.astimezone(_UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def as_stored(value: Any, now: datetime, stamp: str) -> Any:
    """A value of a job row as SQLite stores it: a time as its text (``now``'s is ``stamp``)."""
    if value is now:
        return stamp
    return db_time(value) if isinstance(value, datetime) else value


def parse_time(text: Any) -> datetime | None:
    if text is None:
        return None
    return _parse_time(text)


@lru_cache(maxsize=4096)
def _parse_time(text: str) -> datetime:
    """Cached: the jobs of one claim share their claimed, heartbeat and
    updated times, and jobs enqueued together their created time, so most
    rows repeat a text parsed a moment ago (a tenth of the claiming
    thread's time went here). Aware datetimes are immutable: safe to share."""
    return datetime.fromisoformat(text).replace(tzinfo=_UTC)


def parse_time_required(text: str) -> datetime:
    return _parse_time(text)


def loads(text: str) -> Any:
    """json.loads with the common empty payload short-cut."""
    return {} if text == "{}" else json.loads(text)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise sqlite3 errors from a raw cursor as SQLAlchemy's (IntegrityError,
    OperationalError, ...), which is what every caller catches."""
    try:
        yield
    except sqlite3.Error as exc:
        raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc


class Prepared:
    """A Core statement (``jobdeck.store.statements``) and the order its caller
    gives the values in. ``params`` names them for Core; ``sqlite`` is the
    statement compiled to SQLite text once, the values placed positionally.
    ``for_sqlite`` is the same transition phrased for SQLite's planner, where
    the two differ (``attempt_statements._fenced``); ``as_set`` the same statement
    over arrays, for PostgreSQL's batches."""

    def __init__(
        self,
        stmt: Any,
        order: Sequence[str],
        for_sqlite: Any = None,
        *,
        as_set: Prepared | None = None,
        encoders: Sequence[Callable[[Sequence[Any]], str] | None] = (),
    ) -> None:
        self.stmt = stmt
        self.order = tuple(order)
        self._for_sqlite = stmt if for_sqlite is None else for_sqlite
        self.as_set = as_set
        """PostgreSQL: the same statement taking each value as an array, one
        element per row (``unnest``), in the same order: a batch of rows in
        one statement of one shape instead of a round of ``executemany``
        (``Transactions._run_many``)."""
        self._encoders = tuple(encoders)
        """PostgreSQL: for each value the statement takes as an array, how
        its list is written as the array's literal (``jobdeck.store.postgres``)."""

    def params(self, values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(self.order, self.encoded(values) if self._encoders else values, strict=True))

    def encoded(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """The values in ``order``, each array written as its literal (``_encoders``)."""
        if self._encoders:
            return tuple(v if e is None else e(v) for e, v in zip(self._encoders, values, strict=True))
        return tuple(values)

    @cached_property
    def sqlite(self) -> Compiled:
        return Compiled(self._for_sqlite, self.order)

    @cached_property
    def postgres(self) -> Compiled:
        """The statement as psycopg text, for the claim's driver-level path."""
        from sqlalchemy.dialects.postgresql.psycopg import dialect

        return Compiled(self.stmt, self.order, dialect(paramstyle="format"))  # type: ignore[no-untyped-call]


class Compiled:
    """A Core statement as SQLite (or psycopg) text, compiled once, and how
    to lay out its positional parameters from the caller's values (given in
    ``order``): a value used twice in the text is given once, and constants
    the statement carries (a target state, say) are appended here."""

    def __init__(self, stmt: Any, order: tuple[str, ...], dialect: Any = _DIALECT) -> None:
        compiled = stmt.compile(dialect=dialect)
        self.text: str = compiled.string
        names: list[str] = list(compiled.positiontup or ())
        index = {name: i for i, name in enumerate(order)}
        constants = [n for n in dict.fromkeys(names) if n not in index]
        self._constants = tuple(compiled.binds[n].effective_value for n in constants)
        index.update({n: len(order) + i for i, n in enumerate(constants)})
        positions = [index[n] for n in names]
        self._identity = positions == list(range(len(order))) and not constants
        self.as_given = self._identity
        """The values go to the driver as the caller gives them."""
        self._rows: dict[int, str] = {}
        self._get = itemgetter(*positions) if len(positions) > 1 else None
        self._single = positions[0] if len(positions) == 1 else None

    @cached_property
    def takes_rows(self) -> bool:
        """An ``INSERT ... VALUES (?, ...)`` of one row, its values as given:
        ``rows`` can make it a statement of many."""
        head, sep, row = self.text.rpartition(" VALUES ")
        return self.as_given and head.startswith("INSERT ") and row == "(" + ", ".join("?" * row.count("?")) + ")"

    def rows(self, n: int) -> str:
        """The text of this ``takes_rows`` INSERT for ``n`` rows, their values
        given row after row: one statement for a batch instead of an
        ``executemany``, which steps, resets and hands the GIL back and
        forth once a row."""
        text = self._rows.get(n)
        if text is None:
            head, sep, row = self.text.rpartition(" VALUES ")
            text = self._rows[n] = head + sep + ", ".join([row] * n)
        return text

    def params(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        if self._identity:
            return values
        if self._constants:
            values = values + self._constants
        if self._get is not None:
            return self._get(values)  # type: ignore[no-any-return]
        return () if self._single is None else (values[self._single],)
