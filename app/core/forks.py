"""A process forked from a running worker pool, by a handler calling
``os.fork()`` (or ``multiprocessing`` with the fork start method), is a copy
of the one thread that forked, with the parent's open database connections
and none of its other threads. Left to return into the pool, it ran on as a
second executor thread forever, holding those connections.

So a fork while a pool runs marks the child (``os.register_at_fork``), and
Jobdeck code that runs in a marked child ends it at once with ``os._exit``,
without cleanup of any kind: the pool's executor when the handler returns
or raises in the child (``SystemExit``'s code is kept), and any database
connection the child asks for. The child's connection pools are replaced
before anything can use them, so the parent's connections are never touched
from the child. A child that execs, or does its own work and ends with
``os._exit`` (as ``multiprocessing`` does), never reaches Jobdeck code and
works as before.

A fork while no pool runs (gunicorn's ``--preload`` forking its workers
before ``Jobdeck.start``) is not marked: that child starts its own.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from sqlalchemy import Engine, event

forked = False
"""True in a child forked while a worker pool of its parent was running."""

_running_pools = 0
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def pool_started() -> None:
    global _running_pools
    _running_pools += 1


def pool_stopped() -> None:
    global _running_pools
    _running_pools = max(0, _running_pools - 1)


def watch(engine: Engine) -> None:
    """Refuse ``engine``'s connections in a marked child, and give a child
    a fresh pool of its own (a pool's lock held by another thread of the
    parent at the fork would otherwise stay held forever)."""
    _engines.add(engine)
    event.listen(engine, "do_connect", _refuse_in_child)  # before a connection is opened
    event.listen(engine, "checkout", _refuse_in_child)


def engines() -> list[Engine]:
    """The engines of this process that are still alive (``watch``)."""
    return list(_engines)


def exit_status(exc: BaseException | None) -> int:
    """What a child that returned (None) or raised ``exc`` exits with:
    ``sys.exit(n)``'s own status, 1 for any other exception."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    return 1


def leave(status: int, where: str) -> None:
    """End a marked child now, saying why on stderr (straight to the file:
    the buffers it copied from its parent are not its to flush)."""
    message = (
        f"jobdeck: process {os.getpid()} was forked from a running worker pool and reached {where}; "
        f"it exits now with status {status} (a forked child must exec or end with os._exit)\n"
    )
    try:
        os.write(2, message.encode())
    finally:
        os._exit(status)


def _refuse_in_child(*_args: Any) -> None:
    if forked:
        leave(70, "the database")


def _after_in_child() -> None:
    global forked, _running_pools
    if _running_pools == 0:
        return
    forked = True
    _running_pools = 0
    for engine in list(_engines):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_in_child)
