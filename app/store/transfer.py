"""Moving a deployment with its data to another database (``jobdeck db
copy``), typically from the SQLite file of one host to the PostgreSQL of
several.

Every table of the models' metadata is copied, parents before the tables
whose foreign keys point at them, unless ``SKIPPED`` names it with a reason:
a table added to the models is copied without a change here. Rows keep
their ids, and PostgreSQL's sequences are moved past them (and past ids the
source handed out and deleted since), so a job made after the move never
takes an id a person or a client has already seen.

The copy writes in batches, one transaction each, in primary-key order, and
is safe to run again after an interruption: the checks first prove that
what the target holds is a part of the source
(``jobdeck.store.transfer_checks``), tables keyed by one integer resume
after the highest id copied, and every insert skips a primary key the
target has. At the end it counts each table on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobdeck.store.engine import make_engine
from jobdeck.store.models import metadata
from jobdeck.store.schema import ensure_current
from jobdeck.store.transfer_checks import (
    CopyError,
    CopyRefused,
    Progress,
    pages,
    primary_key,
    refuse_live_pools,
    refuse_other_data,
    refuse_overlong_values,
    refuse_unknown_schema,
    source_connection,
    sqlite_path,
)
from sqlalchemy import Connection, Integer, LargeBinary, Table, func, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

SKIPPED: dict[str, str] = {}
"""Tables of the models that the copy leaves out, each with the reason. None
so far: even the workers' rows are history the Workers page shows, the
maintenance marks keep the roll-up from counting the copied attempts twice,
and the sessions keep people signed in (with the same ``secret_key``)."""

BINARY_BATCH = 10
"""Rows per batch of a table with a binary column (artifacts): each row may
be megabytes, so a batch of the usual size could fill the memory."""

__all__ = ["SKIPPED", "CopyError", "CopyRefused", "TableCount", "copied_tables", "copy_database", "report"]


@dataclass(frozen=True)
class TableCount:
    """One table's rows at the end of a copy, on each side."""

    table: str
    source: int
    target: int
    written: int
    """Rows this run wrote (the rest were there from an earlier run)."""

    @property
    def matches(self) -> bool:
        return self.source == self.target


def copied_tables() -> list[Table]:
    """The tables the copy moves, each after the tables it refers to."""
    return [t for t in metadata.sorted_tables if t.name not in SKIPPED]


def copy_database(
    source_url: str,
    target_url: str,
    *,
    batch_size: int = 1000,
    progress: Progress | None = None,
    stale_after: float = 60.0,
    now: datetime | None = None,
) -> list[TableCount]:
    """Copy every table from the stopped deployment at ``source_url`` into
    ``target_url``, which is migrated to this code's revision first and must
    be empty or hold only an earlier, interrupted run of this copy.
    ``stale_after``: seconds after which a worker pool's heartbeat no longer
    counts as a running process (``refuse_live_pools``). Returns each
    table's count on both sides; raises ``CopyRefused`` before writing a
    row, or ``CopyError`` when a write fails."""
    if batch_size < 1:
        raise CopyRefused(f"the batch size must be at least 1, got {batch_size}")
    if _same_database(source_url, target_url):
        raise CopyRefused("the source and the target are the same database")
    tables = copied_tables()
    with source_connection(source_url) as source:
        refuse_unknown_schema(source)
        refuse_live_pools(source, now, stale_after)
        refuse_overlong_values(source, tables)
        engine = make_engine(target_url, pool_size=1)
        try:
            ensure_current(engine, auto_migrate=True)
            with engine.connect() as target:
                before = {t.name: refuse_other_data(source, target, t, batch_size, progress) for t in tables}
                target.rollback()
                for table in tables:
                    _copy_table(source, target, table, _batch(table, batch_size), progress)
                _move_sequences(source, target, tables)
                counts = [
                    TableCount(t.name, _count(source, t), after := _count(target, t), after - before[t.name])
                    for t in tables
                ]
                target.rollback()
                return counts
        finally:
            engine.dispose()


def report(counts: Sequence[TableCount]) -> list[str]:
    """The counts as lines for people: one per table, then the verdict."""
    width = max([len("table"), *(len(c.table) for c in counts)])
    lines = [f"{'table':<{width}}  {'source':>9}  {'target':>9}  {'written':>9}"]
    for c in counts:
        mark = "" if c.matches else "  MISMATCH"
        lines.append(f"{c.table:<{width}}  {c.source:>9}  {c.target:>9}  {c.written:>9}{mark}")
    wrong = [c.table for c in counts if not c.matches]
    if wrong:
        lines.append(f"the counts differ in {len(wrong)} table(s): {', '.join(wrong)}")
    else:
        rows = sum(c.target for c in counts)
        lines.append(f"the counts match in all {len(counts)} tables ({rows} rows)")
    return lines


def _same_database(a: str, b: str) -> bool:
    path_a, path_b = sqlite_path(a), sqlite_path(b)
    if path_a is not None or path_b is not None:
        return path_a == path_b
    return make_url(a).render_as_string(hide_password=True) == make_url(b).render_as_string(hide_password=True)


def _batch(table: Table, batch_size: int) -> int:
    binary = any(isinstance(c.type, LargeBinary) for c in table.columns)
    return min(batch_size, BINARY_BATCH) if binary else batch_size


def _count(conn: Connection, table: Table) -> int:
    return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _integer_key(table: Table) -> Any:
    pk = primary_key(table)
    return pk[0] if len(pk) == 1 and isinstance(pk[0].type, Integer) else None


def _copy_table(source: Connection, target: Connection, table: Table, batch: int, progress: Progress | None) -> None:
    """Copy the rows of ``table`` the target lacks. A table keyed by one
    integer starts after the target's highest key when the target holds
    exactly the source's rows up to it (an earlier run stopped there);
    otherwise every source row is offered, and those the target has are
    skipped by the insert."""
    total = _count(source, table)
    start: tuple[Any, ...] | None = None
    done = 0
    key = _integer_key(table)
    if key is not None:
        highest, have = target.execute(select(func.max(key), func.count()).select_from(table)).one()
        target.rollback()
        if highest is not None and _count_upto(source, table, key, highest) == have:
            start, done = (highest,), have
    insert = _insert(target.dialect.name)(table).on_conflict_do_nothing(index_elements=primary_key(table))
    if progress is not None:
        progress("copying", table.name, done, total)
    for rows in pages(source, table, batch, start):
        try:
            target.execute(insert, [row._asdict() for row in rows])
            target.commit()
        except DBAPIError as exc:
            target.rollback()
            first, last = (_key_of(table, rows[0]), _key_of(table, rows[-1]))
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
            raise CopyError(
                f"writing {table.name} rows {first} to {last} failed: {reason}. The rows before them are "
                "copied; fix the cause and run the copy again to go on"
            ) from exc
        done += len(rows)
        if progress is not None:
            progress("copying", table.name, min(done, total), total)


def _count_upto(source: Connection, table: Table, key: Any, highest: Any) -> int:
    return int(source.execute(select(func.count()).select_from(table).where(key <= highest)).scalar_one())


def _key_of(table: Table, row: Any) -> str:
    values = [getattr(row, c.name) for c in primary_key(table)]
    return str(values[0]) if len(values) == 1 else str(tuple(values))


def _insert(dialect: str) -> Any:
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise CopyRefused(f"the copy writes to PostgreSQL or SQLite, not {dialect}")


def _move_sequences(source: Connection, target: Connection, tables: Sequence[Table]) -> None:
    """Move each id sequence of the target past the copied ids, and past the
    highest id the source ever handed out (SQLite's AUTOINCREMENT counter,
    or PostgreSQL's sequence), so no id is given out twice."""
    for table in tables:
        column = table.autoincrement_column
        if column is None:
            continue
        highest = target.execute(select(func.max(column))).scalar() or 0
        floor = max(highest, _handed_out(source, table) or 0)
        if floor:
            _move_past(target, table, floor)
    if target.dialect.name == "postgresql":
        # A table loaded in one go has no statistics until autovacuum
        # comes by; the claim's plan on a large ``jobs`` depends on them.
        for table in tables:
            target.exec_driver_sql(f'ANALYZE "{table.name}"')
    target.commit()


def _handed_out(conn: Connection, table: Table) -> int | None:
    """The highest id the database has handed out for ``table``, deleted or not."""
    column = table.autoincrement_column
    assert column is not None
    if conn.dialect.name == "sqlite":
        if not inspect(conn).has_table("sqlite_sequence"):
            return None
        seq = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = :name"), {"name": table.name})
        return seq.scalar()
    if conn.dialect.name == "postgresql":
        last = conn.execute(
            text("SELECT pg_sequence_last_value(pg_get_serial_sequence(:table, :column)::regclass)"),
            {"table": table.name, "column": column.name},
        )
        return last.scalar()
    return None


def _move_past(target: Connection, table: Table, floor: int) -> None:
    column = table.autoincrement_column
    assert column is not None
    if target.dialect.name == "postgresql":
        target.execute(
            text("SELECT setval(pg_get_serial_sequence(:table, :column), :value)"),
            {"table": table.name, "column": column.name, "value": floor},
        )
    elif target.dialect.name == "sqlite" and table.dialect_options["sqlite"]["autoincrement"]:
        # Inserting an id moves SQLite's counter to it; an id handed out and deleted does not.
        target.execute(text("UPDATE sqlite_sequence SET seq = max(seq, :value) WHERE name = :name"),
                       {"value": floor, "name": table.name})  # fmt: skip
