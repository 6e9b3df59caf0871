"""How a SQLite writer waits for another process's write lock
(``jobdeck.store.engine.promptly``): with the busy handler off, asking again
every millisecond up to the busy timeout, then giving up; the connection's
own busy timeout back afterwards. Every write path goes through it: the
engine's BEGIN and the group commit's batch on its raw connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobdeck.store import engine as engine_module

Pair = Callable[..., tuple[sqlite3.Connection, sqlite3.Connection]]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """Two connections to one file (closed at the end): one holds the write lock, one waits."""
    made: list[sqlite3.Connection] = []

    def connect(busy_ms: int = 30_000) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        path = tmp_path / "lock.db"
        holder = sqlite3.connect(path, isolation_level=None)
        made.append(holder)
        holder.execute("PRAGMA journal_mode=WAL")
        holder.execute("CREATE TABLE t (x)")
        waiter = sqlite3.connect(path, isolation_level=None)
        made.append(waiter)
        waiter.execute(f"PRAGMA busy_timeout={busy_ms}")
        return holder, waiter

    yield connect
    for conn in made:
        conn.close()


def _busy(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA busy_timeout").fetchone()[0])


def test_a_locked_writer_asks_again_without_the_busy_handler_until_the_lock_is_free(pair: Pair) -> None:
    holder, waiter = pair()
    holder.execute("BEGIN IMMEDIATE")
    tries: list[int] = []

    def attempt() -> str:
        tries.append(_busy(waiter))  # 0: refused at once, never slept in SQLite's handler
        if len(tries) == 3:
            holder.execute("COMMIT")  # the other process lets go
        waiter.execute("BEGIN IMMEDIATE")
        return "held"

    assert engine_module.promptly(waiter, attempt) == "held"
    assert tries == [0, 0, 0]
    assert waiter.in_transaction and _busy(waiter) == 30_000


def test_it_gives_up_at_the_busy_timeout_and_restores_it(pair: Pair) -> None:
    holder, waiter = pair(busy_ms=50)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        engine_module.promptly(waiter, lambda: waiter.execute("INSERT INTO t VALUES (1)"))
    assert not waiter.in_transaction and _busy(waiter) == 50
    holder.execute("COMMIT")
    assert waiter.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # a refused write changed nothing


def test_other_errors_are_not_retried(pair: Pair) -> None:
    _, waiter = pair()
    calls: list[None] = []

    def attempt() -> Any:
        calls.append(None)
        return waiter.execute("INSERT INTO nowhere VALUES (1)")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        engine_module.promptly(waiter, attempt)
    assert len(calls) == 1 and _busy(waiter) == 30_000


def test_the_group_commits_batch_asks_promptly_too(deck, monkeypatch) -> None:
    from jobdeck.store import enqueue as enqueue_module

    asked: list[int] = []
    given: list[float | None] = []

    def spy(raw: sqlite3.Connection, attempt: Any, busy_timeout: float | None = None) -> Any:
        asked.append(_busy(raw))
        given.append(busy_timeout)
        return engine_module.promptly(raw, attempt, busy_timeout)

    monkeypatch.setattr(enqueue_module, "promptly", spy)
    job, created = deck.enqueue("demo.noop")
    assert created and asked, "the batch took the write lock without promptly"
    assert deck.store.get(job.id).type == "demo.noop"
    # The connection's own timeout, from its pool record: not asked of SQLite each batch.
    assert given == [deck.config.sqlite_busy_timeout] and asked == [int(deck.config.sqlite_busy_timeout * 1000)]
    with deck.store.glance() as db:
        assert _busy(db) == int(deck.config.sqlite_busy_timeout * 1000), "restored after the batch"
