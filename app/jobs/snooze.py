"""Snooze: a handler asks to run again later, without a retry or a failure.

    from jobdeck.jobs.handlers import Snooze, handler

    @handler("crm.sync")
    def sync(payload, ctx):
        if not crm.ready(payload["account"]):
            return Snooze(30)          # or: ctx.snooze(30), which raises it
        crm.sync(payload["account"])

The attempt ends ``snoozed``: the job goes back to ``pending``, due
``seconds`` from now, with its retry count unchanged (``Transition.SNOOZE``).
A cancel requested while the attempt ran still wins: the job ends
``cancelled``. The delay is kept on the attempt's row and shown on the job's
timeline ("snoozed for 30 s").

``Snooze`` is an exception so that both forms work, and so that code deep in
a handler's call stack can snooze the job; any subclass (a rate-limit
back-off) is handled the same way.

To stop a handler from snoozing forever, a job may snooze at most
``max_snoozes`` times in a row (per type: ``@handler(max_snoozes=...)`` or
``[types."T"] max_snoozes``; default ``DEFAULT_MAX_SNOOZES``); the snooze past
it fails the attempt instead, and the fail rule retries or dead-letters the
job as for any failure. Any attempt that is not a snooze starts the count
again.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from jobdeck.core.snooze_words import describe

if TYPE_CHECKING:
    from jobdeck.core.config import Config

MAX_SNOOZE_SECONDS = 365 * 24 * 3600.0
"""The longest snooze (one year): a job meant to wait longer is a schedule."""
DEFAULT_MAX_SNOOZES = 1000
"""Snoozes in a row a job may take before the next one fails its attempt."""
MAX_REASON_CHARS = 500


class InvalidSnooze(ValueError):
    """A snooze's seconds are not a finite number from 0 to ``MAX_SNOOZE_SECONDS``."""


def check_seconds(seconds: Any) -> float:
    """``seconds`` as a float, or ``InvalidSnooze`` saying what is wrong."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidSnooze(f"snooze seconds must be a number, not {type(seconds).__name__}")
    try:
        value = float(seconds)
    except OverflowError:  # an int too large for a float
        raise InvalidSnooze(f"snooze seconds must be at most {MAX_SNOOZE_SECONDS:.0f} (one year)") from None
    if not math.isfinite(value):
        raise InvalidSnooze("snooze seconds must be a finite number")
    if value < 0:
        raise InvalidSnooze("snooze seconds must be >= 0")
    if value > MAX_SNOOZE_SECONDS:
        raise InvalidSnooze(f"snooze seconds must be at most {MAX_SNOOZE_SECONDS:.0f} (one year)")
    return value


class Snooze(Exception):  # noqa: N818  (the word a handler writes: ``return Snooze(30)``)
    """Run this job again ``seconds`` from now; not a retry, not a failure.

    Return it from a handler or raise it (``ctx.snooze(seconds)`` does).
    ``reason`` is shown on the attempt after the delay. Bad seconds raise
    ``InvalidSnooze`` here, so the attempt fails with that message."""

    def __init__(self, seconds: float, reason: str | None = None) -> None:
        self.seconds = check_seconds(seconds)
        self.reason = None if reason is None else str(reason)[:MAX_REASON_CHARS]
        super().__init__(self.describe())

    def describe(self) -> str:
        """What the attempt's row says: "snoozed for 30 s" (and the reason)."""
        return describe(self.seconds, self.reason)


def seconds_of(snooze: BaseException) -> tuple[float, str | None]:
    """A caught snooze's delay and reason, checked again: a subclass may set
    them itself (or not at all, or as a property that raises) instead of
    going through ``Snooze.__init__``. Anything wrong is ``InvalidSnooze``."""
    try:
        seconds, reason = getattr(snooze, "seconds", None), getattr(snooze, "reason", None)
    except Exception as exc:  # a handler's subclass whose property raises: its failure, not the pool's
        raise InvalidSnooze(f"snooze seconds unreadable: {type(exc).__name__}") from None
    return check_seconds(seconds), (reason[:MAX_REASON_CHARS] if isinstance(reason, str) else None)


class _Spec(Protocol):
    @property
    def max_snoozes(self) -> int | None: ...


class _Specs(Protocol):
    """The handler registry (``jobdeck.jobs.handlers.Registry``) as ``max_snoozes``
    reads it: named by shape, as the registry's module imports this one."""

    def get(self, job_type: str) -> _Spec | None: ...


def max_snoozes(config: Config, registry: _Specs, job_type: str) -> int:
    """The type's cap on snoozes in a row: config first, then the handler's
    ``max_snoozes``, else ``DEFAULT_MAX_SNOOZES``."""
    types = config.extra.get("types")
    options = types.get(job_type) if isinstance(types, dict) else None
    if isinstance(options, dict) and "max_snoozes" in options:
        return int(options["max_snoozes"])
    spec = registry.get(job_type)
    if spec is not None and spec.max_snoozes is not None:
        return spec.max_snoozes
    return DEFAULT_MAX_SNOOZES
