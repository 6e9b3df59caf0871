"""Jobdeck's in-process scenarios: drain, enqueue (single, concurrent,
bulk) and enqueue-to-start latency. Each function measures one run and
returns its figure; ``run.py`` repeats them and takes the median."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.common import NOOP, Counter, make_deck, percentile


def _fill(deck: Any, n: int, chunk: int = 5000) -> None:
    for start in range(0, n, chunk):
        deck.enqueue_many([{"type": NOOP} for _ in range(min(chunk, n - start))])


def _completed(deck: Any) -> int:
    return int(deck.store.counts(deck.clock())["completed"])


def pool_maker() -> Any:
    """What builds a pool from a deck and a thread count, from the ``app`` on
    the path: ``jobdeck.runtime.pool_for`` now, the ``WorkerPool`` class
    (``jobdeck.worker.pool``, or ``jobdeck.worker`` before the layout moved)
    before the pool took narrow parts (``bench/compare.py`` runs these
    scenarios against older checkouts too)."""
    try:
        from jobdeck.runtime import pool_for

        return pool_for
    except ImportError:
        pass
    try:
        from jobdeck.worker.pool import WorkerPool
    except ImportError:
        from jobdeck.worker import WorkerPool
    return WorkerPool


def timed_drain(deck: Any, counter: Counter, n: int, threads: int, timeout: float, what: str = "drain") -> float:
    """jobs/s for a pool of ``threads`` on ``deck`` draining ``n`` jobs that
    hit ``counter``, from the pool's start until every completion is committed."""
    pool = pool_maker()(deck, threads)
    t0 = time.perf_counter()
    pool.start()
    if not counter.done.wait(timeout=timeout):
        raise RuntimeError(f"{what} stalled at {counter.n}/{n}")
    while pool.inflight:
        time.sleep(0.001)  # acks still being committed
    elapsed = time.perf_counter() - t0
    pool.stop(grace=5)
    return n / elapsed


def drain(workdir: Path, n: int, synchronous: str = "FULL", threads: int = 4, **overrides: Any) -> float:
    """jobs/s for an embedded pool draining ``n`` pre-enqueued no-op jobs,
    from pool start until every completion is committed. ``overrides`` go to
    the config (``database_url`` drains on PostgreSQL instead)."""
    counter = Counter(n)
    deck = make_deck(workdir / "drain.db", synchronous, threads, handler=lambda p, c: counter.hit(), **overrides)
    try:
        _fill(deck, n)
        rate = timed_drain(deck, counter, n, threads, max(60.0, n / 500))
        done = _completed(deck)
        if done != n:
            raise RuntimeError(f"drain: {done} completed, expected {n}")
        return rate
    finally:
        deck.store.engine.dispose()


def enqueue_single(workdir: Path, n: int, synchronous: str = "FULL", producers: int = 1, **overrides: Any) -> float:
    """jobs/s for ``deck.enqueue`` one job per call (durable on return),
    from ``producers`` threads each making n / producers calls. ``overrides``
    go to the config, as for ``drain``."""
    deck = make_deck(workdir / "enq.db", synchronous, 0, **overrides)
    try:
        per = max(1, n // producers)
        deck.enqueue(NOOP)

        def produce() -> None:
            for _ in range(per):
                deck.enqueue(NOOP)

        workers = [threading.Thread(target=produce) for _ in range(producers)]
        t0 = time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - t0
        return per * producers / elapsed
    finally:
        deck.store.engine.dispose()


def enqueue_many(workdir: Path, n: int, synchronous: str = "FULL", batch: int = 1000, **overrides: Any) -> float:
    """jobs/s for ``deck.enqueue_many`` of ``batch`` jobs per call."""
    deck = make_deck(workdir / "enqm.db", synchronous, 0, **overrides)
    try:
        items = [{"type": NOOP, "payload": {"i": i}} for i in range(batch)]
        deck.enqueue_many(items)
        calls = max(1, n // batch)
        t0 = time.perf_counter()
        for _ in range(calls):
            deck.enqueue_many(items)
        return calls * batch / (time.perf_counter() - t0)
    finally:
        deck.store.engine.dispose()


def latency_inproc(workdir: Path, n: int, synchronous: str = "FULL", threads: int = 4) -> dict[str, float]:
    """Enqueue-to-handler-start at idle: one job at a time, the next one
    only after the previous has started. Milliseconds."""
    started: list[float] = []
    ready = threading.Event()

    def handler(payload: dict[str, Any], ctx: Any) -> None:
        started.append(time.perf_counter())
        ready.set()

    deck = make_deck(workdir / "lat.db", synchronous, threads, handler=handler)
    pool = pool_maker()(deck, threads)
    pool.start()
    try:
        samples: list[float] = []
        for _ in range(n):
            ready.clear()
            t0 = time.perf_counter()
            deck.enqueue(NOOP)
            if not ready.wait(timeout=10):
                raise RuntimeError("latency: job did not start within 10 s")
            samples.append((started[-1] - t0) * 1000)
            while pool.inflight:
                time.sleep(0.0005)  # at idle: the previous ack is committed
        return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "n": n}
    finally:
        pool.stop(grace=5)
        deck.store.engine.dispose()
