"""Handlers of the process executor's tests (``handler_modules =
["tests.process_handlers"]``): a process handler is imported by name in its
child, so these live at module level, each registered on the default
registry by ``register`` (the tests' registries get them too)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

from jobdeck.jobs.handlers import JobContext, Registry


def echo(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    ctx.log("running in %d", os.getpid())
    ctx.progress(0.5, "half way")
    return {"pid": os.getpid(), "echo": payload.get("value")}


def fails(payload: dict[str, Any], ctx: JobContext) -> None:
    raise ValueError(payload.get("message", "bad input"))


def sleeps(payload: dict[str, Any], ctx: JobContext) -> str:
    """Writes its pid to ``payload["pidfile"]``, then sleeps (``ctx.cancelled``
    ends it early unless ``payload["ignore_cancel"]``)."""
    if payload.get("pidfile"):
        Path(payload["pidfile"]).write_text(str(os.getpid()))
    seconds = float(payload.get("seconds", 60))
    if payload.get("ignore_cancel"):
        time.sleep(seconds)
        return "slept"
    if ctx.cancelled.wait(seconds):
        ctx.check_cancelled()
    return "slept"


def spins_in_c(payload: dict[str, Any], ctx: JobContext) -> None:
    """Busy in C for hours, deaf to SIGTERM: SIGTERM is blocked, then the
    regular-expression engine backtracks through 2**40 ways of matching,
    inside one C call that never returns to Python (no bytecode runs, so no
    Python-level timeout or signal handler could ever interrupt it)."""
    Path(payload["pidfile"]).write_text(str(os.getpid()))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    re.match(r"(a+)+$", "a" * 40 + "b")


def allocates(payload: dict[str, Any], ctx: JobContext) -> int:
    block = bytearray(int(payload["bytes"]))
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block)


def segfaults(payload: dict[str, Any], ctx: JobContext) -> None:
    ctypes.string_at(0)


def returns_a_set(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"tags": {"a", "b"}}


async def awaits(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    return {"pid": os.getpid(), "loop": type(asyncio.get_running_loop()).__name__}


def plain(payload: dict[str, Any], ctx: JobContext) -> int:
    """Registered without ``executor=``: the config's tables choose."""
    return os.getpid()


def leaves_a_thread(payload: dict[str, Any], ctx: JobContext) -> None:
    """Returns at once, leaving a thread that logs and reports progress for half a second after."""

    def chatter() -> None:
        for _ in range(50):
            ctx.log("left behind by job %s", ctx.job_id)
            ctx.progress(0.9, "left behind")
            time.sleep(0.01)  # a thread that outlives its handler, by design of the test

    threading.Thread(target=chatter, daemon=True).start()


def keeps_files(payload: dict[str, Any], ctx: JobContext) -> str:
    """An artifact from bytes and one from a path, then one with a bad name (refused, not retried)."""
    info = ctx.artifact("report.csv", "a,b\n1,2\n")
    assert info.size == 8 and info.content_type.startswith("text/csv"), info
    path = Path(payload["dir"]) / "chart.bin"
    path.write_bytes(bytes(range(256)))
    ctx.artifact("chart.bin", path)
    if payload.get("bad_name"):
        ctx.artifact("../escape.txt", b"no")
    return "kept"


def exits(payload: dict[str, Any], ctx: JobContext) -> None:
    os._exit(int(payload.get("code", 7)))


def snoozes(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.snooze(30, "waiting for the upstream")


def charges(payload: dict[str, Any], ctx: JobContext) -> Any:
    """An effect performed in the child, recorded by the parent; ``payload["mark"]`` counts its runs."""

    def charge() -> dict[str, Any]:
        with open(payload["mark"], "a", encoding="utf-8") as fh:
            fh.write("charged\n")
        return {"receipt": payload["order"]}

    receipt = ctx.effect(f"charge:{payload['order']}", charge)
    if payload.get("then_fail"):
        raise ConnectionError("the reply was lost")
    return receipt


def local_handler_type(reg: Registry) -> None:
    """A process handler defined in a function: not importable by name."""

    @reg.handler("proc.local", executor="process", max_retries=0)
    def local(payload: dict[str, Any], ctx: JobContext) -> None:
        return None


HANDLERS = {
    "proc.echo": echo, "proc.fails": fails, "proc.sleeps": sleeps, "proc.spins": spins_in_c,
    "proc.allocates": allocates, "proc.segfaults": segfaults, "proc.exits": exits, "proc.snoozes": snoozes,
    "proc.charges": charges, "proc.set": returns_a_set, "proc.awaits": awaits,
    "proc.leaves": leaves_a_thread, "proc.files": keeps_files,
}  # fmt: skip


def register(reg: Registry, **options: Any) -> None:
    for name, fn in HANDLERS.items():
        reg.handler(name, **{"executor": "process", "max_retries": 0, **options.get(name, {})})(fn)
