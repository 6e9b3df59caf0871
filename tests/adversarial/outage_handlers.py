"""The job type of the storage-outage tests' real processes
(``handler_modules = ["tests.adversarial.outage_handlers"]``): each run
appends its job id and pid to a file outside the database's disk, so a test
counts executions whatever the database managed to store.

``payload["gate"]`` names a file the run waits for before it records and
returns: the test decides when the handler finishes (while the disk is
full). One short ``write`` of an ``O_APPEND`` file per run: lines from
several processes never interleave."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handlers import registry as default_registry

MARK = "outage.mark"


def mark(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    gate = payload.get("gate")
    while gate and not os.path.exists(gate):
        ctx.cancelled.wait(0.02)  # the test opens the gate; a cancel does not end the wait
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.job_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return {"pid": os.getpid()}


def register(registry: Registry) -> None:
    registry.handler(MARK, max_retries=3)(mark)


def runs(path: Path) -> Counter[int]:
    """Executions per job id recorded in ``path`` so far."""
    if not path.exists():
        return Counter()
    return Counter(int(line.split()[0]) for line in path.read_text().splitlines() if line.strip())


register(default_registry)
