"""What makes this process unhealthy, for ``/api/health``.

Services that can wedge in a way only a restart cures (the worker pool with
too many abandoned handler threads) register a check against their deck;
the health endpoint of an app on that deck answers 503 while any check
gives a reason. Keyed weakly by deck, so a test's decks do not pile up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from app.deck import Jobdeck

Check = Callable[[], "str | None"]
"""Returns why the service is unhealthy, or None."""

_checks: WeakKeyDictionary[Jobdeck, list[Check]] = WeakKeyDictionary()
_lock = threading.Lock()


def register(deck: Jobdeck, check: Check) -> None:
    with _lock:
        _checks.setdefault(deck, []).append(check)


def unregister(deck: Jobdeck, check: Check) -> None:
    with _lock:
        checks = _checks.get(deck, [])
        if check in checks:
            checks.remove(check)


def problems(deck: Jobdeck) -> list[str]:
    """Every reason this process is unhealthy, empty when it is healthy."""
    with _lock:
        checks = list(_checks.get(deck, []))
    return [reason for reason in (check() for check in checks) if reason]
