"""Handlers of the executor contract (``tests/test_executor_contract.py``),
each a plain function with an ``async def`` twin. The thread executor runs
the plain ones, the process executor the same plain ones in a child (which
imports them by name: ``handler_modules = ["tests.contract_handlers"]``),
and the pool's event loop the async ones. Files, not events, say where a
handler is and let it go on: a child shares no memory with the test."""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from pathlib import Path
from typing import Any

from jobdeck.core.errors import Cancelled, DeadLetter
from jobdeck.jobs.handlers import JobContext, Registry


def _mark(payload: dict[str, Any], name: str, text: str = "") -> None:
    Path(payload["dir"], name).write_text(text)


def echo(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"echo": payload["value"], "pid": os.getpid()}


async def aecho(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return echo(payload, ctx)


def flaky(payload: dict[str, Any], ctx: JobContext) -> int:
    """Fails its first ``payload["failures"]`` runs with an error a retry can fix."""
    if ctx.retries < payload["failures"]:
        raise ConnectionError(f"run {ctx.retries + 1} lost the connection")
    return ctx.attempt


async def aflaky(payload: dict[str, Any], ctx: JobContext) -> int:
    await asyncio.sleep(0)
    return flaky(payload, ctx)


def refuses(payload: dict[str, Any], ctx: JobContext) -> None:
    raise DeadLetter(f"no such customer {payload['customer']}")


async def arefuses(payload: dict[str, Any], ctx: JobContext) -> None:
    await asyncio.sleep(0)
    refuses(payload, ctx)


def hold(payload: dict[str, Any], ctx: JobContext) -> int:
    """Writes its pid to ``started``, then waits for the test's ``go`` file;
    a cancel ends the wait (writing ``stopped``) unless ``payload["deaf"]``.
    Writes ``finished`` when it returns its attempt's number."""
    _mark(payload, "started", str(os.getpid()))
    go = Path(payload["dir"], "go")
    while not go.exists():
        if payload.get("deaf"):
            time.sleep(0.01)  # polls the file, deaf to ctx.cancelled by design of the test
        elif ctx.cancelled.wait(0.01):
            _mark(payload, "stopped", str(ctx.cancel_reason))
            ctx.check_cancelled()
    _mark(payload, "finished")
    return ctx.attempt


async def ahold(payload: dict[str, Any], ctx: JobContext) -> int:
    _mark(payload, "started", str(os.getpid()))
    go = Path(payload["dir"], "go")
    try:
        while not go.exists():
            await asyncio.sleep(0.01)
            if not payload.get("deaf"):
                ctx.check_cancelled()
    except (asyncio.CancelledError, Cancelled):  # the task's cancel, or the handler's own check
        _mark(payload, "stopped", str(ctx.cancel_reason))
        raise
    _mark(payload, "finished")
    return ctx.attempt


def snoozes(payload: dict[str, Any], ctx: JobContext) -> int:
    if ctx.attempt == 1:
        ctx.snooze(0.05, "not yet")
    return ctx.attempt


async def asnoozes(payload: dict[str, Any], ctx: JobContext) -> int:
    await asyncio.sleep(0)
    return snoozes(payload, ctx)


def _charge(payload: dict[str, Any]) -> dict[str, Any]:
    with open(Path(payload["dir"], "charges"), "a", encoding="utf-8") as fh:
        fh.write(f"{payload['key']}\n")
    if payload.get("no_answer"):
        raise TimeoutError("the gateway did not answer")
    return {"receipt": payload["key"]}


async def _acharge(payload: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _charge(payload)


def charges(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Performs an effect, then fails its first run after it: the retry must find it done."""
    receipt = ctx.effect(payload["key"], lambda: _charge(payload))
    if ctx.retries == 0:
        raise ConnectionError("the reply was lost")
    return receipt


async def acharges(payload: dict[str, Any], ctx: JobContext) -> Any:
    receipt = await ctx.aeffect(payload["key"], lambda: _acharge(payload))
    if ctx.retries == 0:
        raise ConnectionError("the reply was lost")
    return receipt


def logs(payload: dict[str, Any], ctx: JobContext) -> None:
    for n in range(3):
        ctx.log("line %d of %s", n, payload["name"])
    ctx.log.warning("the last one")
    ctx.progress(0.5, "half way")


async def alogs(payload: dict[str, Any], ctx: JobContext) -> None:
    await asyncio.sleep(0)
    logs(payload, ctx)


def keeps(payload: dict[str, Any], ctx: JobContext) -> int:
    """An artifact from text and one from a file."""
    info = ctx.artifact("report.csv", "a,b\n1,2\n")
    path = Path(payload["dir"], "chart.bin")
    path.write_bytes(bytes(range(256)))
    ctx.artifact("chart.bin", path)
    return int(info.size)


async def akeeps(payload: dict[str, Any], ctx: JobContext) -> int:
    await asyncio.sleep(0)
    return keeps(payload, ctx)


def surface(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """What every ``ctx`` offers beyond the steps above: its batch, and the
    deprecated ``once`` (True the first time only), which still warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        once = [ctx.once(payload["key"]), ctx.once(payload["key"])]
    warned = sum(issubclass(w.category, DeprecationWarning) for w in caught)
    return {"batch_id": ctx.batch_id, "once": once, "warned": warned}


async def asurface(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return surface(payload, ctx)


async def aeffects(payload: dict[str, Any], ctx: JobContext) -> Any:
    """``await ctx.aeffect`` twice with one key, another task of the handler
    running meanwhile: the second is the first's result, performed once."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    ticker = asyncio.ensure_future(tick())
    try:
        first = await ctx.aeffect(payload["key"], lambda: _acharge(payload))  # type: ignore[attr-defined]
        again = await ctx.aeffect(payload["key"], lambda: _acharge(payload))  # type: ignore[attr-defined]
    finally:
        ticker.cancel()
    return {"first": first, "again": again, "pid": os.getpid(), "ticked": ticks > 0}


RETRIES = {"max_retries": 2, "backoff_base": 0.01, "backoff_cap": 0.01}
HANDLERS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "contract.echo": (echo, aecho, {}),
    "contract.flaky": (flaky, aflaky, RETRIES),
    "contract.refuses": (refuses, arefuses, RETRIES),
    "contract.hold": (hold, ahold, {"max_retries": 0}),
    "contract.hangs": (hold, ahold, {"max_retries": 0, "timeout": 0.5}),
    "contract.snoozes": (snoozes, asnoozes, {"max_retries": 0}),
    "contract.charges": (charges, acharges, RETRIES),
    "contract.logs": (logs, alogs, {}),
    "contract.keeps": (keeps, akeeps, {}),
    "contract.surface": (surface, asurface, {}),
}
ASYNC_ONLY: dict[str, tuple[Any, dict[str, Any]]] = {"contract.aeffects": (aeffects, {"max_retries": 0})}
"""Async on every executor: on ``process`` in a child (on a loop of its own), on the others on the pool's loop."""


def register(reg: Registry, executor: str) -> None:
    """Every contract type on ``executor``: ``thread``, ``async`` or ``process``."""
    for name, (fn, afn, options) in HANDLERS.items():
        if executor == "async":
            reg.handler(name, **options)(afn)
        else:
            reg.handler(name, executor=executor, **options)(fn)
    for name, (afn, options) in ASYNC_ONLY.items():
        reg.handler(name, **({"executor": "process"} if executor == "process" else {}), **options)(afn)
