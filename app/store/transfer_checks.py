"""What ``jobdeck db copy`` checks before it writes anything: that nothing
runs on the source, that the source is at this code's schema, and that the
target holds nothing but what an earlier run of the same copy put there.

A copy of a deployment that is still running would miss what its processes
write meanwhile, and two deployments sharing job ids cannot be merged, so
both are refused rather than half done (``jobdeck.store.transfer``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobdeck.store.engine import make_engine
from jobdeck.store.models import workers
from jobdeck.store.schema import HEAD
from sqlalchemy import (
    Connection,
    Engine,
    String,
    Table,
    create_engine,
    event,
    func,
    inspect,
    or_,
    select,
    text,
    tuple_,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool

Progress = Callable[[str, str, int, int], None]
"""``(step, table, rows done, rows in all)``: how far a step has got in one table."""


class CopyError(Exception):
    """The copy stopped; the message says why and what to do. What it wrote
    before stays, and running it again goes on from there."""


class CopyRefused(CopyError):
    """The copy did not start: the source is in use or not at this code's
    schema, or the target holds other data. No row was written."""


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names; None for PostgreSQL or in-memory SQLite."""
    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name).resolve()


@contextmanager
def source_connection(url: str) -> Iterator[Connection]:
    """One connection to the source, held for the whole copy.

    On SQLite it takes the file's exclusive lock (``locking_mode=EXCLUSIVE``
    before the first read) and keeps it until the copy ends: in WAL mode
    every open connection of another process (a ``serve``, a ``worker``, an
    app that embeds Jobdeck, even one idle in its pool) holds a shared lock
    on the file for as long as it is open, so the lock is granted only when
    no other process has the file open, and while it is held no process can
    start on the file and change it under the copy. The connection never
    writes (``query_only``). A file that does not exist is refused rather
    than created empty. On PostgreSQL (the way back) it reads one
    REPEATABLE READ snapshot; ``refuse_live_pools`` tells a running
    deployment there."""
    path = sqlite_path(url)
    if make_url(url).get_backend_name() != "sqlite":
        # The snapshot may sit idle for as long as the target takes to write a batch.
        engine = make_engine(url, pool_size=1, idle_in_transaction=0)
    elif path is None:
        raise CopyRefused(f"the source {url} is not a database file")
    elif not path.is_file():
        raise CopyRefused(f"no database at {path}: the source must be an existing Jobdeck database")
    else:
        engine = _exclusive_sqlite(url)
    try:
        try:
            conn = engine.connect()
            if path is None:
                conn.execution_options(isolation_level="REPEATABLE READ")
        except OperationalError as exc:
            if "locked" not in str(exc.orig):
                raise
            raise CopyRefused(
                f"a process has {path} open (SQLite refused the copy its exclusive lock): stop every "
                "`jobdeck serve`, `jobdeck worker` and app using it, then run the copy again"
            ) from None
        with conn:
            yield conn
    finally:
        engine.dispose()


def _exclusive_sqlite(url: str) -> Engine:
    engine = create_engine(url, poolclass=StaticPool, connect_args={"timeout": 1.0, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _exclusive(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        dbapi_conn.execute("PRAGMA query_only=ON")
        dbapi_conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # takes the lock, or raises

    return engine


def refuse_unknown_schema(source: Connection) -> None:
    """The source must be at this code's revision: the copy reads it with
    this code's tables, and migrates the target to the same revision."""
    have: set[str] = set()
    if inspect(source).has_table("alembic_version"):
        have = {row[0] for row in source.execute(text("SELECT version_num FROM alembic_version"))}
    if have != {HEAD}:
        at = ", ".join(sorted(have)) or "none (not a Jobdeck database, or one from before migrations)"
        raise CopyRefused(
            f"the source's schema is at revision {at}, this version of Jobdeck copies revision {HEAD}: "
            "run `jobdeck db upgrade` on the source first (with the source as the database)"
        )


def refuse_live_pools(source: Connection, now: datetime | None, stale_after: float) -> None:
    """Refuse while a worker pool's row says it runs: not stopped, not
    marked gone, and heart-beating within ``stale_after`` seconds. On
    PostgreSQL this is what tells a running deployment; on SQLite it also
    catches a process on another host that uses the file over a network
    share, where the file lock may not reach. A pool killed a moment ago
    looks the same until its heartbeat is ``stale_after`` old."""
    moment = now or datetime.now(UTC)
    live = source.execute(
        select(workers.c.id, workers.c.host, workers.c.pid, workers.c.heartbeat_at)
        .where(
            workers.c.stopped_at.is_(None),
            workers.c.gone_at.is_(None),
            workers.c.heartbeat_at > moment - timedelta(seconds=stale_after),
        )
        .order_by(workers.c.heartbeat_at.desc())
    ).all()
    if live:
        pool = live[0]
        ago = max(0.0, (moment - pool.heartbeat_at).total_seconds())
        raise CopyRefused(
            f"{len(live)} worker pool(s) still beat on the source, e.g. {pool.id} (host {pool.host}, pid "
            f"{pool.pid}), {ago:.0f} s ago, and never stopped: stop them, or, if they were killed, wait "
            f"until their last beat is {stale_after:.0f} s old, then run the copy again"
        )


def refuse_overlong_values(source: Connection, tables: Sequence[Table]) -> None:
    """Every bounded text in the source must fit its column. SQLite stores a
    ``varchar(n)`` value of any length; PostgreSQL refuses a longer one, so
    the copy would stop midway at that row's batch with the database's words.
    One scan a table, before anything is written; the first row too long is named."""
    for table in tables:
        bounded = {c: n for c in table.c if (n := _bound(c))}
        if not bounded:
            continue
        pk = primary_key(table)
        too_long = or_(*(func.length(c) > n for c, n in bounded.items()))
        row = source.execute(select(*pk, *bounded).where(too_long).order_by(*pk).limit(1)).first()
        if row is None:
            continue
        key = tuple(row[: len(pk)])
        column, n = next((c, n) for c, n in bounded.items() if len(getattr(row, c.name) or "") > n)
        raise CopyRefused(
            f"{table.name}.{column.name} of row {_shown(key)} is {len(getattr(row, column.name))} characters, "
            f"longer than the {n} its column holds on the target (SQLite did not enforce it): "
            "change or delete that row on the source, then run the copy again"
        )


def _bound(column: Any) -> int | None:
    """The length a text column holds, None when unbounded."""
    kind = column.type
    return kind.length if isinstance(kind, String) else None


def primary_key(table: Table) -> list[Any]:
    return list(table.primary_key.columns)


def where_key_in(table: Table, keys: Sequence[tuple[Any, ...]]) -> Any:
    pk = primary_key(table)
    if len(pk) == 1:
        return pk[0].in_([key[0] for key in keys])
    return tuple_(*pk).in_(keys)


def after_key(table: Table, key: tuple[Any, ...]) -> Any:
    pk = primary_key(table)
    if len(pk) == 1:
        return pk[0] > key[0]
    return tuple_(*pk) > tuple_(*key)


def pages(conn: Connection, table: Table, batch: int, start: tuple[Any, ...] | None = None) -> Iterator[Sequence[Any]]:
    """The table's rows in primary-key order, ``batch`` at a time, after ``start``."""
    pk = primary_key(table)
    last = start
    while True:
        query = select(table).order_by(*pk).limit(batch)
        if last is not None:
            query = query.where(after_key(table, last))
        rows = conn.execute(query).all()
        if not rows:
            return
        yield rows
        last = tuple(getattr(rows[-1], c.name) for c in pk)
        if len(rows) < batch:
            return


def refuse_other_data(
    source: Connection, target: Connection, table: Table, batch: int, progress: Progress | None = None
) -> int:
    """Every row the target's ``table`` holds must be in the source, the
    same in every column: then it was put there by an earlier run of this
    copy, which the next run completes. Anything else is another
    deployment's data (or the source changed since that run), and merging
    the two would mix up their jobs: refused. Returns the target's rows."""
    total = target.execute(select(func.count()).select_from(table)).scalar_one()
    if not total:
        return 0
    pk = primary_key(table)
    seen = 0
    for rows in pages(target, table, batch):
        keys = [tuple(getattr(row, c.name) for c in pk) for row in rows]
        theirs = {
            tuple(getattr(row, c.name) for c in pk): row._asdict()
            for row in source.execute(select(table).where(where_key_in(table, keys)))
        }
        for key, row in zip(keys, rows, strict=True):
            mine = theirs.get(key)
            if mine != row._asdict():
                what = (
                    "is not in the source" if mine is None else f"differs from the source's in {_differing(mine, row)}"
                )
                raise CopyRefused(
                    f"the target already holds other data: {table.name} row {_shown(key)} {what}. Copy into "
                    "an empty database (or drop and recreate this one); if the source ran again after an "
                    "interrupted copy, empty the target and copy again"
                )
        seen += len(rows)
        if progress is not None:
            progress("checking", table.name, seen, total)
    return int(total)


def _differing(mine: dict[str, Any], row: Any) -> str:
    theirs = row._asdict()
    return ", ".join(name for name in theirs if mine.get(name) != theirs[name]) or "its columns"


def _shown(key: tuple[Any, ...]) -> str:
    return str(key[0]) if len(key) == 1 else str(key)
