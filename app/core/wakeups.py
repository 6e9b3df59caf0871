"""Events the store emits and the layers above listen to, so that the
store never calls up into them: it says "jobs became claimable in this
process" or "these running jobs were asked to cancel", and whoever
subscribed (a worker pool of this process) acts on it.

A listener runs on the emitting thread, right after the commit, so it must
be quick and must not raise: a pool's listener sets an event or a flag."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Event(Generic[P]):
    """A list of listeners, called in the order they subscribed."""

    def __init__(self) -> None:
        self._listeners: tuple[Callable[P, object], ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, listener: Callable[P, object]) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: Callable[P, object]) -> None:
        """Stop calling ``listener`` (a stopped pool); nothing if it was not subscribed."""
        with self._lock:
            listeners = list(self._listeners)
            if listener in listeners:
                listeners.remove(listener)
            self._listeners = tuple(listeners)

    @property
    def listeners(self) -> tuple[Callable[P, object], ...]:
        return self._listeners

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:  # a snapshot: (un)subscribing meanwhile waits for the next emit
            listener(*args, **kwargs)
