"""A job type whose handler forks (``handler_modules =
["tests.fork_handlers"]``), for the test of what a forked child of a handler
may do: ``payload["ending"]`` says how the child ends, ``payload["mark"]``
names a file the child writes when it gets to do its own work."""

from __future__ import annotations

import multiprocessing
import os
import shlex
import sys
from typing import Any

from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handlers import registry as default_registry

FORKS = "fork.child"
ENDINGS = ("return", "sys.exit", "raise", "ctx", "own-work", "exec", "multiprocessing")
"""How the child ends: returns from the handler, ``sys.exit(3)``, raises,
calls ``ctx.progress`` (Jobdeck code on the database) and then writes the
mark, writes the mark then ``os._exit``, execs a shell that writes it, or is
a ``multiprocessing`` fork that writes it."""


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def forks(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    ending, mark = payload["ending"], payload["mark"]
    if ending == "multiprocessing":
        child = multiprocessing.get_context("fork").Process(target=_write, args=(mark, "multiprocessing"))
        child.start()
        child.join(30)
        return {"child": child.pid, "exitcode": child.exitcode}
    pid = os.fork()
    if pid:
        return {"child": pid}  # not waited for: a child that never ends must not hang the job
    if ending == "sys.exit":
        sys.exit(3)
    if ending == "raise":
        raise RuntimeError("raised in the child")
    if ending == "ctx":
        ctx.progress(0.5, "from the child")
        _write(mark, "the child went on after ctx.progress")
    if ending == "own-work":
        _write(mark, "own work")
        os._exit(0)
    if ending == "exec":
        os.execv("/bin/sh", ["sh", "-c", f"echo exec > {shlex.quote(mark)}"])
    return {"from": "the child"}


def register(registry: Registry) -> None:
    registry.handler(FORKS, max_retries=0)(forks)


register(default_registry)
