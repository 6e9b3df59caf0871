"""Group commit for concurrent single enqueues (SQLite).

Each ``enqueue`` must be durable when it returns, so on its own each costs
one commit (one fsync with ``synchronous=FULL``). When several threads (the
HTTP server's) enqueue at once, one of them leads: it takes every request
queued so far and commits them in one transaction while the others wait,
each on its own event. The leader then wakes exactly the callers it
committed for, and hands the lead to the oldest request still queued. A
thread wake-up can cost more than the insert, so waiting on the write lock
would make every committed caller take the lock in turn just to learn it was
done (batches of one or two), and one shared condition would wake every
waiter per batch. No extra thread, no timer: a lone caller commits alone and
waits for nobody.

A failing batch is retried one request per transaction, so one bad job
fails only its own caller. An interrupt in the leader's thread is not
retried: the batch may already be committed (``InterruptedCommit``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass
class _Request(Generic[R]):
    item: Any
    done: bool = False
    result: R | None = None
    error: BaseException | None = None
    wake: threading.Event = field(default_factory=threading.Event)
    """Set when ``done``, or when this request's thread is to lead."""


@dataclass
class GroupCommitter(Generic[R]):
    """``write_batch(items) -> results`` runs inside one transaction that the
    caller's ``lock`` serializes; ``submit`` returns this item's result only
    after the transaction holding it has committed."""

    lock: Any
    write_batch: Callable[[list[Any]], list[R]]
    after: Callable[[list[Any], list[R]], list[R]] | None = None
    """``after(items, results) -> results`` for the requests a batch
    committed, outside ``lock`` and after the lead has passed on (the next
    batch commits meanwhile), before their callers wake: a read they all
    want once the batch is durable. It must not raise: the batch is committed."""
    _queue: list[_Request[R]] = field(default_factory=list)
    _mutex: threading.Lock = field(default_factory=threading.Lock)
    _leading: bool = False
    batches: int = 0
    """Transactions committed (for tests and the benchmark)."""

    def submit(self, item: Any) -> R:
        request: _Request[R] = _Request(item)
        with self._mutex:
            self._queue.append(request)
            lead = not self._leading
            self._leading = True
        if not lead:
            request.wake.wait()
        if not request.done:  # leading: commit everything queued, this request included
            with self._mutex:
                batch, self._queue = self._queue, []
            try:
                with self.lock:
                    self._commit(batch)
            finally:
                with self._mutex:
                    if self._queue:
                        self._queue[0].wake.set()  # the oldest waiter leads the next batch
                    else:
                        self._leading = False
                try:
                    self._after(batch)
                finally:
                    for r in batch:
                        if r is not request:
                            r.wake.set()
        if request.error is not None:
            raise request.error
        return request.result  # type: ignore[return-value]

    def _after(self, batch: list[_Request[R]]) -> None:
        committed = [r for r in batch if r.done and r.error is None]
        if self.after is None or not committed:
            return
        results = self.after([r.item for r in committed], [r.result for r in committed])  # type: ignore[misc]
        for r, result in zip(committed, results, strict=True):
            r.result = result

    def _commit(self, batch: list[_Request[R]]) -> None:
        try:
            results = self.write_batch([r.item for r in batch])
        except Exception:
            if len(batch) == 1:
                batch[0].error = _current_error()
                batch[0].done = True
                return
            for r in batch:
                self._commit([r])
            return
        except BaseException as exc:
            # An interrupt (KeyboardInterrupt, SystemExit) in the leader's
            # thread is raised once the call into the database returns, so the
            # batch may be committed: retrying it row by row could store every
            # job twice. The others learn that their job's fate is unknown, as
            # after any interrupted commit, and the leader's thread gets its
            # interrupt.
            for r in batch:
                r.error = InterruptedCommit(exc)
                r.done = True
            raise
        self.batches += 1
        for r, result in zip(batch, results):
            r.result = result
            r.done = True


def _current_error() -> BaseException:
    import sys

    error = sys.exc_info()[1]
    assert error is not None
    return error


class InterruptedCommit(RuntimeError):
    """A group commit's leader was interrupted while it wrote the batch that
    held this request: the job may or may not have been stored."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the commit holding this enqueue was interrupted ({cause!r}); the job may have been stored")
        self.__cause__ = cause
