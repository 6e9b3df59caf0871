"""Shared helpers: statistics, the machine description, and Jobdeck decks
on a fresh SQLite file with the no-op job type the peers also run."""

from __future__ import annotations

import importlib
import os
import platform
import sqlite3
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NOOP = "bench.noop"


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return float(ordered[k])


def repeat(fn: Callable[[], float], runs: int, warmup: bool = True) -> dict[str, Any]:
    """Run ``fn`` once to warm up (discarded), then ``runs`` times; the
    figure is the median, the others are kept to show the spread."""
    if warmup:
        fn()
    values = [fn() for _ in range(runs)]
    return {"median": median(values), "runs": values}


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


class Counter:
    """Counts handler runs; ``done`` is set when ``target`` is reached."""

    def __init__(self, target: int = 0) -> None:
        self.n = 0
        self.target = target
        self.done = threading.Event()
        self._lock = threading.Lock()

    def reset(self, target: int) -> None:
        with self._lock:
            self.n = 0
            self.target = target
            self.done.clear()

    def hit(self) -> None:
        with self._lock:
            self.n += 1
            if self.n >= self.target:
                self.done.set()


def make_deck(
    path: Path, synchronous: str = "FULL", workers: int = 4, handler: Callable[..., Any] | None = None, **overrides: Any
) -> Any:
    """A Jobdeck on a fresh SQLite file at ``path`` with ``bench.noop``."""
    from jobdeck.core.config import load
    from jobdeck.jobs.handlers import Registry

    try:
        from jobdeck.deck import Jobdeck
    except ImportError:  # a checkout from before the layout moved (bench/compare.py runs those too)
        from app.service import Jobdeck

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    reg = Registry()
    reg.handler(NOOP, max_retries=0)(handler or (lambda payload, ctx: None))
    values: dict[str, Any] = {
        "database_url": f"sqlite:///{path}",
        "instance_path": str(path.parent / "instance"),
        "workers": workers,
        "sqlite_synchronous": synchronous,
        "secret_key": "bench",
    }
    values.update(overrides)
    deck = Jobdeck(load(path=None, env={}, overrides=values), reg)
    _install_parts(deck)
    deck.init_db()
    return deck


def _install_parts(deck: Any) -> None:
    """Give a deck of an older checkout the parts ``jobdeck serve`` gave it
    (queue controls as the claim policy, alerts, schedules): today's deck
    builds them itself, so without this a baseline would run a bare store and
    the comparison would measure the parts, not the change."""
    for wiring in ("app.wiring",):
        try:
            module = importlib.import_module(wiring)
        except ImportError:
            continue
        module.install(deck)
