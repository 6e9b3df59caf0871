"""Job types for the clock-skew and partition tests, which run in real
worker processes (``handler_modules = ["tests.skew_handlers"]``).

``skew.hold`` holds its attempt for ``payload["seconds"]`` (its later
attempts for ``payload["later"]``, if given), waking at once on
``ctx.cancelled``, then records the run as one JSON line in the file
``payload["log"]`` names, with this host's true ``time.time()``; with
``payload["effect"]`` it performs one effect through ``ctx.effect`` (an
append to ``payload["effects"]``) after the hold (before it, with
``effect_first``); with ``ignore_cancel`` it sleeps through a cancel;
with ``chatty`` it writes a ``ctx.log`` line every 0.1 s while it holds. One short write of an ``O_APPEND``
file per line: lines from several processes never interleave."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobdeck.core.errors import Cancelled
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handlers import registry as default_registry

HOLD = "skew.hold"


def append(path: str, row: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def hold(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    started = time.time()
    row = {"job": ctx.job_id, "attempt": ctx.attempt, "worker": ctx.worker_id, "pid": os.getpid(), "start": started}
    append(payload["log"], {**row, "event": "start"})
    seconds = float(payload.get("seconds", 0) if ctx.attempt == 1 else payload.get("later", payload.get("seconds", 0)))
    effect = (lambda: _effect(payload, ctx)) if payload.get("effect") else (lambda: None)
    if payload.get("effect_first"):
        effect()
    if payload.get("ignore_cancel"):
        time.sleep(seconds)  # a handler that never looks at ctx.cancelled
    elif _wait(ctx, seconds, bool(payload.get("chatty"))):
        append(payload["log"], {**row, "event": "stopped", "reason": ctx.cancel_reason, "end": time.time()})
        raise Cancelled(ctx.job_id)
    if not payload.get("effect_first"):
        effect()
    append(payload["log"], {**row, "event": "done", "end": time.time()})
    return {"pid": os.getpid()}


def _wait(ctx: JobContext, seconds: float, chatty: bool) -> bool:
    """Wait ``seconds`` or until cancelled (True); ``chatty``: writing a
    ``ctx.log`` line every 0.1 s meanwhile."""
    if not chatty:
        return ctx.cancelled.wait(seconds)
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        if ctx.cancelled.wait(min(0.1, left)):
            return True
        ctx.log("still holding, %.1f s left", left)
    return False


def _effect(payload: dict[str, Any], ctx: JobContext) -> None:
    """One effect through the ledger: an append to ``payload["effects"]``."""
    key = f"effect:{payload['effect']}"
    ctx.effect(key, lambda: append(payload["effects"], {"key": key, "job": ctx.job_id, "pid": os.getpid()}))


def register(registry: Registry) -> None:
    registry.handler(HOLD)(hold)


def read(path: Any) -> list[dict[str, Any]]:
    """Every line written to ``path`` so far."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


register(default_registry)
