"""Handlers register by job type with a decorator, with per-type options.

    from jobdeck.jobs.handlers import handler

    @handler("pdf.render", max_retries=5, timeout=30, queue="reports", non_retryable=["KeyError"])
    def render(payload, ctx):
        ...

The decorator registers on the default registry; handler modules are named
in config (``handler_modules``) and imported at start. The ``ctx`` a handler
gets, ``JobContext``, lives in ``jobdeck.jobs.context`` and is re-exported here.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from jobdeck.core.errors import DeadLetter, InvalidField
from jobdeck.core.validation import MAX_QUEUE_CHARS, MAX_TYPE_CHARS, parse_priority
from jobdeck.core.validation import check_name as checked_name
from jobdeck.jobs.artifacts import InvalidArtifact
from jobdeck.jobs.context import JobContext
from jobdeck.jobs.handles import Handle
from jobdeck.jobs.payloads import PayloadShape, shape_of, typed_call
from jobdeck.jobs.snooze import Snooze

__all__ = ["HandlerSpec", "JobContext", "Registry", "Snooze", "handler", "import_modules", "registry"]

EXECUTORS = ("thread", "process")
"""What ``executor`` accepts, in ``@handler`` and under ``[types."T"]`` or ``[queues.NAME]``."""

Handler = Callable[[dict[str, Any], "JobContext"], Any]
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    fn: Handler
    max_retries: int | None = None
    """Default for jobs of this type when the enqueue does not say."""
    timeout: float | None = None
    """Seconds; an attempt running longer is failed ("timed out after N s")."""
    queue: str | None = None
    backoff_base: float | None = None
    backoff_cap: float | None = None
    priority: int | None = None
    non_retryable: tuple[str, ...] = ()
    """Exception class names (``"ValueError"``, or dotted with the module,
    ``"requests.HTTPError"``) that can never succeed on a retry: an attempt
    raising one, or a subclass of one, sends the job straight to ``dead``.
    ``[types."T"] non_retryable`` in the config adds to it."""
    max_snoozes: int | None = None
    """Snoozes in a row allowed before the next one fails the attempt
    (``jobdeck.jobs.snooze``); None: ``[types."T"] max_snoozes`` or the default."""
    executor: str | None = None
    """``"process"``: its jobs run in a child process (``jobdeck.worker.processes``);
    ``"thread"`` or None: on the pool's threads (its loop, for ``async def``).
    ``[types."T"] executor`` in the config overrides it."""
    payload_shape: PayloadShape | None = None
    """The payload's type when the handler annotates it with a dataclass, a
    TypedDict or a pydantic model (``jobdeck.jobs.payloads``): every enqueue
    is checked against it, and ``fn`` converts the payload before the call."""

    @property
    def is_async(self) -> bool:
        """An ``async def`` handler (or an object whose ``__call__`` is one):
        its jobs run as tasks on the pool's event loop (``jobdeck.worker.async_loop``)."""
        return is_async_callable(self.fn)

    def retries(self, exc: BaseException, also: Collection[str] = ()) -> bool:
        """Whether the failure ``exc`` is worth a retry. Never for a
        ``DeadLetter`` (the handler said so), an ``InvalidField`` (the
        payload failed validation: the same payload fails the same way) or
        an ``InvalidArtifact`` (``ctx.artifact`` refused a name or a size the
        next attempt would build again, at the same cost), nor for a class
        listed in ``non_retryable`` or ``also``."""
        if isinstance(exc, (DeadLetter, InvalidField, InvalidArtifact)):
            return False
        listed = set(self.non_retryable).union(also)
        if not listed:
            return True
        for cls in type(exc).__mro__:
            if cls.__name__ in listed or f"{cls.__module__}.{cls.__qualname__}" in listed:
                return False
        return True


def is_async_callable(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}
        self._async: frozenset[str] = frozenset()

    def handler(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        timeout: float | None = None,
        queue: str | None = None,
        backoff_base: float | None = None,
        backoff_cap: float | None = None,
        priority: int | None = None,
        non_retryable: Iterable[str] = (),
        max_snoozes: int | None = None,
        executor: str | None = None,
    ) -> Callable[[Callable[P, R]], Handle[P, R]]:
        """Register a handler for jobs of type ``name``; returns its ``Handle``
        (the function, callable as before, with ``.enqueue``: ``jobdeck.jobs.handles``)."""
        name = checked_name(name, "type", MAX_TYPE_CHARS)
        if queue is not None:
            queue = checked_name(queue, "queue", MAX_QUEUE_CHARS)
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
        ):
            raise ValueError(f"{name}: max_retries must be an integer >= 0")
        if priority is not None:
            # Checked as an enqueue's is: a float went to the store as it was,
            # rounded by one insert's cast and cut short by a bulk one's literal.
            try:
                priority = parse_priority(priority)
            except InvalidField as exc:
                raise ValueError(f"{name}: {exc}") from None
        if timeout is not None and timeout <= 0:
            raise ValueError(f"{name}: timeout must be > 0")
        if isinstance(non_retryable, str):
            raise ValueError(f"{name}: non_retryable must be a list of exception class names, not one string")
        names = tuple(non_retryable)
        if max_snoozes is not None and (
            isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0
        ):
            raise ValueError(f"{name}: max_snoozes must be an integer >= 0")
        if executor not in (None, *EXECUTORS):
            raise ValueError(f"{name}: executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")

        def register(fn: Callable[P, R]) -> Handle[P, R]:
            fn = fn.__wrapped__ if isinstance(fn, Handle) else fn
            try:
                shape = shape_of(fn)
            except TypeError as exc:
                raise ValueError(f"{name}: {exc}") from None
            run = typed_call(fn, shape, is_async_callable(fn)) if shape else fn
            self._specs[name] = HandlerSpec(
                name, cast(Handler, run), max_retries, timeout, queue, backoff_base, backoff_cap, priority,
                non_retryable=names, max_snoozes=max_snoozes, executor=executor, payload_shape=shape,
            )  # fmt: skip
            self._async = frozenset(
                n for n, spec in self._specs.items() if spec.is_async and spec.executor != "process"
            )
            return Handle(fn, name, self, shape)

        return register

    def get(self, name: str) -> HandlerSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def async_names(self) -> frozenset[str]:
        """The types whose handlers are ``async def``: claimed into the pool's
        ``async_concurrency``, not its threads."""
        return self._async

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def copy(self) -> Registry:
        """A registry with this one's handlers, to which more are registered
        without changing this one (their specs are frozen, so shared)."""
        copied = Registry()
        copied._specs = dict(self._specs)
        copied._async = self._async
        return copied


registry = Registry()
"""The default registry that ``@handler`` writes to."""

handler = registry.handler


def import_modules(names: list[str]) -> None:
    """Import the handler modules named in config; a bad name stops start-up.

    The current folder is searched first, as ``python -m`` would: the
    ``jobdeck`` command's own folder is on ``sys.path``, the project's
    is not, and ``handler_modules = ["myapp.jobs"]`` names the project's."""
    from jobdeck.core.config import ConfigError

    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"handler_modules: cannot import {name!r}: {exc}") from None
