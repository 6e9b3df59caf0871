"""Login throttling: per account, per address, and a bound on hashing.

A password check costs about 0.1 s of CPU (scrypt), so an unthrottled login
form is both a password-guessing oracle and a way to starve the API: every
wrong password is answered, and a flood of them holds the CPU that
``/api/health`` and the API need. Three defences, all decided before any hashing:

- after ``limit`` failures within ``window`` seconds for one account, or
  from one address, further attempts get 429 with ``Retry-After`` until the
  oldest failure leaves the window;
- at most ``hash_slots`` password checks run at once in the process; an
  attempt that finds them busy is answered 429 at once rather than queued
  behind them, so a flood never holds the server's threads;
- the tables are bounded (``max_keys``), so rotating names cannot grow
  memory without bound.

The counts live in the process: several processes behind one balancer each
allow ``limit`` failures. Behind a reverse proxy every client has the
proxy's address, so the per-address limit becomes a global one (the
per-account limit still holds). A flood against one account locks its owner
out for up to ``window`` seconds: the price of stopping the guessing.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class LoginThrottle:
    def __init__(
        self, limit: int = 10, window: float = 60.0, *, hash_slots: int = 1, max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._hashing = threading.BoundedSemaphore(hash_slots)

    @staticmethod
    def keys(account: str, address: str | None) -> list[str]:
        """The counters one attempt touches (names cut short: they are keys only)."""
        return [f"account:{account[:200]}", f"address:{address or '?'}"]

    def retry_after(self, keys: Iterable[str]) -> int | None:
        """Whole seconds until an attempt on ``keys`` is allowed; None: now."""
        now = self.clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                times = self._live(key, now)
                if times is not None and len(times) >= self.limit:
                    wait = max(wait, times[0] + self.window - now)
        return max(1, math.ceil(wait)) if wait > 0 else None

    def failed(self, keys: Iterable[str]) -> None:
        now = self.clock()
        with self._lock:
            for key in keys:
                times = self._live(key, now)
                if times is None:
                    self._make_room(now)
                    times = self._failures[key] = deque(maxlen=self.limit)
                times.append(now)

    def succeeded(self, account_key: str) -> None:
        """A right password clears its account's count (not its address's:
        an attacker with one valid account must not reset the address)."""
        with self._lock:
            self._failures.pop(account_key, None)

    @contextmanager
    def hashing(self) -> Iterator[bool]:
        """Yields True while holding a hashing slot, False when all are busy."""
        got = self._hashing.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self._hashing.release()

    def _live(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def _make_room(self, now: float) -> None:
        if len(self._failures) < self.max_keys:
            return
        for key in [k for k, t in self._failures.items() if t[-1] <= now - self.window]:
            del self._failures[key]
        while len(self._failures) >= self.max_keys:
            del self._failures[next(iter(self._failures))]  # the oldest counter goes first
