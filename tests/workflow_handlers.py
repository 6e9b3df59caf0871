"""Job types for the workflow tests that run in real worker processes
(``handler_modules = ["tests.workflow_handlers"]``): each run appends one
JSON line to the file its payload names, so the test can judge afterwards
which process ran which step, when it started and when it finished.

One short ``write`` of an ``O_APPEND`` file per run: lines from several
processes never interleave."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobdeck.core.errors import DeadLetter
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handlers import registry as default_registry

STEP = "wf.step"
"""Records its run; sleeps ``payload["seconds"]``; with ``payload["fail"]`` fails for good."""
CALLBACK = "wf.callback"
"""Records its run with the batch its payload carries (a batch's callback)."""


def _record(payload: dict[str, Any], ctx: JobContext, started: float, **extra: Any) -> None:
    row = {
        "job": ctx.job_id,
        "attempt": ctx.attempt,
        "step": payload.get("step"),
        "wf": payload.get("wf"),
        "start": started,
        "end": time.time(),
        "pid": os.getpid(),
        **extra,
    }
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def step(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    started = time.time()
    time.sleep(float(payload.get("seconds", 0)))
    if payload.get("fail"):
        raise DeadLetter(f"step {payload.get('step')} fails for good")
    _record(payload, ctx, started, deps=ctx.dependency_results())
    return {"step": payload.get("step"), "pid": os.getpid()}


def callback(payload: dict[str, Any], ctx: JobContext) -> None:
    _record(payload, ctx, time.time(), batch=payload["batch"])


def register(registry: Registry) -> None:
    """Register both types on ``registry`` (the test's own deck needs them to enqueue)."""
    registry.handler(STEP)(step)
    registry.handler(CALLBACK)(callback)


def read_log(path: Any) -> list[dict[str, Any]]:
    """Every run recorded in ``path`` so far (none when nothing ran yet)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


register(default_registry)
