"""Sessions of other processes on the PostgreSQL server: a worker marked
gone can leave one behind, inside a transaction, holding its jobs' rows
(``end_sessions_of``). Found by the ``application_name`` every session of
ours carries (``jobdeck.store.engine.session_name``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobdeck.core import processes
from jobdeck.store.engine import session_name
from jobdeck.store.models import workers
from sqlalchemy import column, func, select, table

if TYPE_CHECKING:
    from jobdeck.store import Store

_ACTIVITY = table(
    "pg_stat_activity", column("pid"), column("application_name"), column("datname"), column("xact_start")
)


def end_sessions_of(store: Store, worker_ids: Iterable[str]) -> int:
    """PostgreSQL: end the sessions of the processes of workers just marked
    gone that are inside a transaction, and return how many ended.

    A host cut off in the middle of a write (a partition) can leave its
    backend holding row locks for good: when the cut falls between the
    messages of one statement batch (a pipelined ``executemany``), the server
    never gets the Sync that would start ``idle_in_transaction_session_timeout``,
    and a relay or pooler in between keeps the socket open, so TCP
    keepalives see nothing wrong either. The other hosts' rescue skips locked
    rows (``FOR UPDATE SKIP LOCKED``), so that worker's job would stay
    ``running`` forever. A worker marked gone has lost its lease: whatever its
    sessions hold is refused anyway. Sessions are found by the
    ``application_name`` (``jobdeck.store.engine.session_name``) of the host
    and pid the pool registered in its ``workers`` row; this
    process's own are never ended, and a role that may not end them is logged
    by the caller, not fatal."""
    if store.sqlite:
        return 0
    ids = list(worker_ids)
    own = session_name(f"{processes.HOST}:{os.getpid()}")
    with store.write() as conn:
        found = conn.execute(select(workers.c.host, workers.c.pid).where(workers.c.id.in_(ids))).all()
        names = {session_name(f"{host}:{pid}") for host, pid in found} - {own}
        if not names:
            return 0
        ended = (
            conn.execute(
                select(func.pg_terminate_backend(_ACTIVITY.c.pid)).where(
                    _ACTIVITY.c.application_name.in_(sorted(names)),
                    _ACTIVITY.c.datname == func.current_database(),
                    _ACTIVITY.c.xact_start.is_not(None),
                    _ACTIVITY.c.pid != func.pg_backend_pid(),
                )
            )
            .scalars()
            .all()
        )
    return sum(1 for e in ended if e)
