"""What makes this process unhealthy, for ``/api/health``.

Services that can wedge in a way only a restart cures (the worker pool with
too many abandoned handler threads) register a check on the ``Health`` they
are given (the deck's); the health endpoint of an app on that deck answers
503 while any check gives a reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Check = Callable[[], "str | None"]
"""Returns why the service is unhealthy, or None."""


class Health:
    """The health checks of one deck."""

    def __init__(self) -> None:
        self._checks: list[Check] = []
        self._lock = threading.Lock()

    def register(self, check: Check) -> None:
        with self._lock:
            self._checks.append(check)

    def unregister(self, check: Check) -> None:
        with self._lock:
            if check in self._checks:
                self._checks.remove(check)

    def problems(self) -> list[str]:
        """Every reason this process is unhealthy, empty when it is healthy."""
        with self._lock:
            checks = list(self._checks)
        return [reason for reason in (check() for check in checks) if reason]
