"""The raw ceiling: plain ``sqlite3`` doing the same database work as
Jobdeck on the same schema (inserts; claims of a batch per UPDATE ...
RETURNING; completions per batch plus one attempts row per job), with no
queue machinery around it. Each Jobdeck figure is shown as a fraction of it."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import NOOP


def _db(path: Path, synchronous: str) -> sqlite3.Connection:
    from jobdeck.store.engine import create_schema
    from sqlalchemy import create_engine

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    engine = create_engine(f"sqlite:///{path}")
    create_schema(engine)
    engine.dispose()
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def _now() -> str:
    return datetime.now(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


_INSERT = (
    "INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries, "
    "available_at, created_at, updated_at) VALUES (?, 'default', '{}', 0, 'pending', 0, 0, 0, ?, ?, ?)"
)


def insert_single(path: Path, n: int, synchronous: str = "FULL") -> float:
    """Rows/s, one INSERT per transaction (the floor under a durable enqueue)."""
    conn = _db(path, synchronous)
    t0 = time.perf_counter()
    for _ in range(n):
        now = _now()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_INSERT, (NOOP, now, now, now))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - t0)
    conn.close()
    return rate


def insert_many(path: Path, n: int, synchronous: str = "FULL", batch: int = 1000) -> float:
    """Rows/s, ``batch`` rows per executemany and transaction."""
    conn = _db(path, synchronous)
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        now = _now()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_INSERT, [(NOOP, now, now, now)] * min(batch, n - start))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - t0)
    conn.close()
    return rate


def drain(path: Path, n: int, synchronous: str = "FULL", batch: int = 100) -> float:
    """Jobs/s: claim ``batch`` per statement, then complete them and record
    their attempts in a second transaction, one thread, until none is due."""
    conn = _db(path, synchronous)
    now = _now()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(_INSERT, [(NOOP, now, now, now)] * n)
    conn.execute("COMMIT")
    claim = (
        "UPDATE jobs SET status='running', attempt=attempt+1, worker_id=?, claimed_at=?, heartbeat_at=?, "
        "updated_at=? WHERE id IN (SELECT id FROM jobs INDEXED BY ix_jobs_claim WHERE status IN ('pending','failed') "
        "AND available_at <= ? AND type IN (?) ORDER BY priority DESC, available_at, id LIMIT ?) "
        "RETURNING id, attempt, payload"
    )
    done = 0
    t0 = time.perf_counter()
    while True:
        now = _now()
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(claim, ("raw", now, now, now, now, NOOP, batch)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            break
        ids = [r[0] for r in rows]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"UPDATE jobs SET status='completed', finished_at=?, updated_at=? WHERE id IN ({','.join('?' * len(ids))}) "
            "AND worker_id='raw' AND status='running'",
            (now, now, *ids),
        )
        conn.executemany(
            "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome) "
            "VALUES (?, ?, 'raw', ?, ?, 'completed')",
            [(r[0], r[1], now, now) for r in rows],
        )
        conn.execute("COMMIT")
        done += len(rows)
    rate = done / (time.perf_counter() - t0)
    conn.close()
    if done != n:
        raise RuntimeError(f"raw drain: {done} of {n}")
    return rate
