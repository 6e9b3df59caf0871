"""Handlers register by job type with a decorator, with per-type options.

    from app.handlers import handler

    @handler("pdf.render", max_retries=5, timeout=30, queue="reports")
    def render(payload, ctx):
        ...

The decorator registers on the default registry; handler modules are named
in config (``handler_modules``) and imported at start.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from app.store import Store

Handler = Callable[[dict[str, Any], "JobContext"], Any]
F = TypeVar("F", bound=Handler)


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


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

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
    ) -> Callable[[F], F]:
        if max_retries is not None and max_retries < 0:
            raise ValueError(f"{name}: max_retries must be >= 0")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"{name}: timeout must be > 0")

        def register(fn: F) -> F:
            self._specs[name] = HandlerSpec(
                name, fn, max_retries, timeout, queue, backoff_base, backoff_cap, priority
            )
            return fn

        return register

    def get(self, name: str) -> HandlerSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs


registry = Registry()
"""The default registry that ``@handler`` writes to."""

handler = registry.handler


def import_modules(names: list[str]) -> None:
    """Import the handler modules named in config; a bad name stops start-up."""
    from app.config import ConfigError

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"handler_modules: cannot import {name!r}: {exc}") from None



class JobContext:
    """What a handler gets besides its payload."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        attempt: int,
        worker_id: str,
        job_type: str,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt = attempt
        self.worker_id = worker_id
        self.type = job_type
        self.log = logging.getLogger(f"jobdeck.job.{job_type}")
        self._clock = clock or (lambda: datetime.now(UTC))

    def once(self, key: str) -> bool:
        """Record the effect ``key`` durably; True the first time only.

        Call it right before an irreversible side effect and perform the
        effect only when it returns True::

            if ctx.once(f"charge:{order_id}"):
                gateway.charge(order_id, amount)

        If the effect then raises, call ``ctx.forget(key)`` (``effect`` below
        does this for you) so the retry performs it.
        """
        return self.store.record_effect(key, self.job_id, self.attempt, self._clock())

    def forget(self, key: str) -> None:
        self.store.forget_effect(key)

    def effect(self, key: str, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` at most once per ``key`` across every attempt and
        worker. Returns True if it ran now, False if an earlier attempt did.
        If ``fn`` raises, the record is withdrawn and the error propagates."""
        if not self.once(key):
            self.log.info("effect %s already performed; skipping", key)
            return False
        try:
            fn()
        except BaseException:
            self.forget(key)
            raise
        return True

    def progress(self, fraction: float | None, message: str | None = None) -> None:
        """Report progress (0..1) with an optional message; shown live."""
        if fraction is not None:
            fraction = max(0.0, min(1.0, float(fraction)))
        self.store.set_progress(self.job_id, self.attempt, self.worker_id, fraction, message, self._clock())
