"""A handler that forks, in a real ``jobdeck worker`` process, on SQLite and
PostgreSQL (``jobdeck.core.forks``).

A child that returns from the handler, calls ``sys.exit`` or raises used to
run on forever as a second executor thread holding the parent's database
connections; one that called ``ctx.progress`` wrote through the parent's
connection. Each now exits at once, with its own status (read from the
zombie's ``/proc`` entry: the worker does not reap children it did not
start), before touching the database. A child that does its own work and
``os._exit``s, one that execs, and a ``multiprocessing`` fork still work.
The parent goes on claiming and completing jobs afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry

from tests import fork_handlers
from tests.adversarial.cli_process import children
from tests.conftest import wait_for
from tests.worker_processes import start_workers, stop, write_config

pytestmark = [pytest.mark.backends, pytest.mark.slow]

SETTINGS = (
    'secret_key = "s"\nworkers = 2\npoll_interval = 0.05\nheartbeat_interval = 0.3\nstall_timeout = 5.0\n'
    'shutdown_grace = 2.0\nhandler_modules = ["tests.fork_handlers"]\n'
)
EXPECTED_STATUS = {"return": 0, "sys.exit": 3, "raise": 1, "ctx": 70, "own-work": 0, "exec": 0}
"""The status each child ends with: its handler's (``sys.exit(3)``, an
exception), or 70 for one stopped on its way to the database."""


@pytest.fixture
def fdeck(make_deck: Callable[..., Jobdeck], registry: Registry) -> Jobdeck:
    fork_handlers.register(registry)
    return make_deck()


@pytest.fixture
def worker(fdeck: Jobdeck, db_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One worker process; at teardown, it and any child that outlived it
    (a child that never ended, on a failure) are stopped."""
    (proc,) = start_workers(write_config(db_url, tmp_path, SETTINGS), 1)
    try:
        yield proc
    finally:
        left = descendants(proc.pid)
        stop([proc])
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, wait status) from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0], int(fields[-1])


def finished(deck: Jobdeck, ids: list[int], worker: subprocess.Popen[bytes]) -> bool:
    assert worker.poll() is None, f"the worker exited with {worker.returncode}"
    return all(deck.store.get(i).status in (State.COMPLETED, State.DEAD) for i in ids)


def test_a_forked_child_of_a_handler_exits_at_once_and_the_worker_goes_on(
    fdeck: Jobdeck, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    marks = {ending: tmp_path / f"mark-{ending.replace('.', '-')}" for ending in fork_handlers.ENDINGS}
    jobs = {
        ending: fdeck.enqueue(fork_handlers.FORKS, {"ending": ending, "mark": str(mark)})[0].id
        for ending, mark in marks.items()
    }
    wait_for(lambda: finished(fdeck, list(jobs.values()), worker), timeout=60, interval=0.05, message="the jobs")
    results = {ending: fdeck.store.get(job_id) for ending, job_id in jobs.items()}
    assert {e: j.status for e, j in results.items()} == dict.fromkeys(jobs, State.COMPLETED), {
        e: j.error for e, j in results.items()
    }

    def child_ended(ending: str) -> tuple[str, int] | bool:
        """A zombie: it ended (the worker never waits for children it did not start)."""
        state = process_state(results[ending].result["child"])
        return state is not None and state[0] == "Z" and state

    for ending, status in EXPECTED_STATUS.items():
        pid = results[ending].result["child"]
        _, wait_status = wait_for(
            lambda e=ending: child_ended(e), timeout=10, interval=0.05,
            message=f"the child of the {ending!r} handler (pid {pid}) to exit; it is {process_state(pid)}",
        )  # fmt: skip
        assert wait_status >> 8 == status, f"the {ending!r} child exited with {wait_status >> 8}, not {status}"

    assert not marks["ctx"].exists(), "the child went on past ctx.progress, on the parent's database"
    assert fdeck.store.get(jobs["ctx"]).progress is None, "the child's ctx.progress reached the database"
    assert marks["own-work"].read_text() == "own work"
    assert marks["exec"].read_text() == "exec\n"
    assert marks["multiprocessing"].read_text() == "multiprocessing"
    assert results["multiprocessing"].result["exitcode"] == 0
    living = [p for p in children(worker.pid) if (process_state(p) or ("gone",))[0] != "Z"]
    assert living == [], f"children of the worker still running: {living}"

    # The parent's connections were never the children's: it claims and completes more.
    again = [fdeck.enqueue(fork_handlers.FORKS, {"ending": "return", "mark": ""})[0].id for _ in range(5)]
    wait_for(lambda: finished(fdeck, again, worker), timeout=30, interval=0.05, message="the second round")
    assert {fdeck.store.get(i).status for i in again} == {State.COMPLETED}
    log = (tmp_path / "worker0.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    print(f"{len(jobs)} forking handlers: every child exited with its own status; then 5 more jobs completed")
