"""The ``ctx`` of a handler run by the process executor, in the child
(``jobdeck.worker.child``): the surface of ``JobContext`` and of
``AsyncJobContext`` (``aeffect``), its database work done by the parent.

Logs and progress are sent to the parent, which writes them; an artifact,
an effect's ledger steps, a rate limit, the dependencies' results, the
batch and the deprecated ``once`` are calls the parent answers with the
attempt's real context (``jobdeck.worker.process_run``). Only ``store`` is
missing: the child never opens the database.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from jobdeck.core.errors import Cancelled, EffectNotPerformed
from jobdeck.jobs.context import JobContext
from jobdeck.jobs.snooze import Snooze

if TYPE_CHECKING:
    from jobdeck.worker.child import Child


class ChildLog:
    """``ctx.log`` in the child: each line goes to the parent, which keeps it with the attempt."""

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send

    def __call__(self, message: object, *args: Any, level: str = "info") -> None:
        try:
            text = str(message) % args if args else str(message)
        except (TypeError, ValueError):
            text = f"{message} {args!r}"
        self._send("log", level, text)

    def debug(self, message: object, *args: Any) -> None:
        self(message, *args, level="debug")

    def info(self, message: object, *args: Any) -> None:
        self(message, *args, level="info")

    def warning(self, message: object, *args: Any) -> None:
        self(message, *args, level="warning")

    def error(self, message: object, *args: Any) -> None:
        self(message, *args, level="error")

    def critical(self, message: object, *args: Any) -> None:
        self(message, *args, level="critical")


class ChildContext:
    """What a handler in a child process gets besides its payload: the
    ``ctx`` of a thread's handler, its database writes done by the parent."""

    MAX_RATE_LIMITED = JobContext.MAX_RATE_LIMITED
    EFFECT_WAIT = JobContext.EFFECT_WAIT
    """Seconds the parent waits for another job's attempt holding an effect's key (``JobContext.effect``)."""
    FINISH_TRIES = JobContext.FINISH_TRIES

    def __init__(self, child: Child, job: dict[str, Any]) -> None:
        self._child = child
        self.job_id: int = job["id"]
        self.attempt: int = job["attempt"]
        self.retries: int = job["retries"]
        self.type: str = job["type"]
        self.worker_id: str = job["worker_id"]
        self.cancelled = threading.Event()
        self.cancel_reason: str | None = None
        self.log = ChildLog(self._send)
        self.trace: Any = None

    def _send(self, *message: Any) -> None:
        """Send for this attempt only: a thread the handler left behind that
        logs after the attempt ended must not write into the next job's."""
        self._child.send_for(self, *message)

    def _call(self, name: str, *args: Any) -> Any:
        return self._child.call(self, name, args)

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled(self.job_id)

    def snooze(self, seconds: float, reason: str | None = None) -> NoReturn:
        raise Snooze(seconds, reason)

    def progress(self, fraction: float | None, message: str | None = None) -> None:
        self._send("progress", fraction, message)

    async def progress_written(self) -> None:
        """Progress leaves the child as it is reported: nothing is left to wait for."""

    def artifact(self, name: str, data_or_path: Any, content_type: str | None = None) -> Any:
        if isinstance(data_or_path, os.PathLike):
            with open(data_or_path, "rb") as fh:
                data_or_path = fh.read()
        return self._call("artifact", name, data_or_path, content_type)

    def rate_limited(self, seconds: float) -> NoReturn:
        from jobdeck.jobs.flow import RateLimited

        self._call("rate_limited", seconds)
        raise RateLimited(float(seconds))

    def dependency_results(self) -> dict[str, Any]:
        return dict(self._call("dependency_results"))

    @property
    def batch_id(self) -> int | None:
        """The batch this job belongs to, if any (as ``JobContext.batch_id``)."""
        value: int | None = self._call("batch_id")
        return value

    def once(self, key: str) -> bool:
        """Deprecated: use ``effect`` (see ``JobContext.once``)."""
        warnings.warn("JobContext.once is deprecated; use ctx.effect(key, fn)", DeprecationWarning, stacklevel=2)
        return bool(self._call("once", key))

    def effect(self, key: str, fn: Callable[..., Any], *, replay_safe: bool = False) -> Any:
        """``ctx.effect``, two-phase as on a thread: the parent records the
        key ``started`` (or answers with an earlier attempt's result), the
        child performs ``fn``, the parent records it ``done``."""
        decided, value = self._call("effect_begin", key, replay_safe)
        if decided == "skip":
            return value
        try:
            result = fn(key) if replay_safe else fn()
        except EffectNotPerformed:
            self._call("effect_withdraw", key)
            raise
        if inspect.isawaitable(result):  # never awaited: not performed, and its repr is no result
            getattr(result, "close", lambda: None)()
            self._call("effect_withdraw", key)
            raise TypeError(f"effect {key}: fn returned an awaitable; use `await ctx.aeffect(key, fn)`")
        return self._call("effect_done", key, as_json(result))

    async def aeffect(self, key: str, fn: Callable[..., Any], *, replay_safe: bool = False) -> Any:
        """``ctx.aeffect`` of an ``async def`` handler (``AsyncJobContext.aeffect``):
        ``fn`` returns an awaitable, awaited at most once per ``key``. The
        parent's answers are waited for on a thread, so the handler's own
        other tasks run meanwhile."""
        decided, value = await asyncio.to_thread(self._call, "effect_begin", key, replay_safe)
        if decided == "skip":
            return value
        try:
            result = fn(key) if replay_safe else fn()
            if inspect.isawaitable(result):
                result = await result
        except EffectNotPerformed:
            await asyncio.to_thread(self._call, "effect_withdraw", key)
            raise
        return await asyncio.to_thread(self._call, "effect_done", key, as_json(result))


def as_json(value: Any) -> str:
    """An effect's value as strict JSON text, or its repr as a JSON string, as the ledger keeps it."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except Exception:
            text = f"<unrepresentable {type(value).__name__}>"
        return json.dumps(text)
