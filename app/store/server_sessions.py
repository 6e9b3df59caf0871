"""Sessions of other processes on the PostgreSQL server: a worker marked
gone can leave one behind, inside a transaction, holding its jobs' rows
(``end_sessions_of``). Found by the ``application_name`` every session of
ours carries (``jobdeck.store.engine.session_name``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobdeck.core import processes
from jobdeck.store.engine import session_name
from jobdeck.store.models import workers
from sqlalchemy import column, exists, func, select, table
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from jobdeck.store import Store

_ACTIVITY = table("pg_stat_activity", column("pid"), column("application_name"), column("datname"))
_LOCKS = table("pg_locks", column("pid"), column("locktype"), column("granted"))


def end_sessions_of(store: Store, worker_ids: Iterable[str]) -> Ended:
    """PostgreSQL: end the sessions of the processes of workers just marked
    gone that are inside a transaction, one by one, and say how many ended
    and which were refused.

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
    and pid the pool registered in its ``workers`` row and the nonce of its
    id (``_process_of``); this process's own are never ended, and a role that may not end them is logged
    by the caller, not fatal."""
    if store.sqlite:
        return Ended(0, [])
    ids = list(worker_ids)
    own = session_name(processes.name())
    ended, refused = 0, []
    with store.write() as conn:
        found = conn.execute(select(workers.c.id, workers.c.host, workers.c.pid).where(workers.c.id.in_(ids))).all()
        names = {session_name(_process_of(*row)) for row in found} - {own}
        if not names:
            return Ended(0, [])
        pids = (
            conn.execute(
                select(_ACTIVITY.c.pid).where(
                    _ACTIVITY.c.application_name.in_(sorted(names)),
                    _ACTIVITY.c.datname == func.current_database(),
                    _inside_a_transaction(),
                    _ACTIVITY.c.pid != func.pg_backend_pid(),
                )
            )
            .scalars()
            .all()
        )
        for pid in pids:  # one by one: a session this role may not end keeps no other from ending
            try:
                with conn.begin_nested():
                    ended += bool(conn.execute(select(func.pg_terminate_backend(pid))).scalar())
            except DBAPIError as exc:
                refused.append(str(exc.orig or exc).strip())
    return Ended(ended, refused)


@dataclass(frozen=True)
class Ended:
    """What ``end_sessions_of`` did: how many sessions ended, and why each
    one it may not end was refused (a superuser's, to another role)."""

    count: int
    refused: list[str]


def _process_of(worker_id: str, host: str, pid: int) -> str:
    """``host:pid.nonce`` (``jobdeck.core.processes.name``) of a worker's
    process: host and pid from its row, the nonce from its id
    (``host:pid.nonce:pool``) when the id agrees with the row; otherwise
    ``host:pid``, which only a process of an older version carries. An id
    can only narrow the row's host and pid, never name another's."""
    prefix = f"{host}:{pid}."
    if worker_id.startswith(prefix):
        nonce = worker_id[len(prefix) :].partition(":")[0]
        if nonce:
            return f"{host}:{pid}.{nonce}"
    return f"{host}:{pid}"


def _inside_a_transaction() -> Any:
    """The session holds its virtual transaction id's lock, which every
    transaction takes first and keeps to its end. Not ``xact_start`` (nor
    ``state``): the server shows those of another role's sessions only to
    a superuser or a member of ``pg_read_all_stats``, and a sweeper granted
    ``pg_signal_backend`` would find none of them; ``pg_locks`` is shown to anyone."""
    return exists().where(
        _LOCKS.c.pid == _ACTIVITY.c.pid, _LOCKS.c.locktype == "virtualxid", _LOCKS.c.granted.is_(True)
    )
