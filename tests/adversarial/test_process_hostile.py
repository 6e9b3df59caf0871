"""Handlers that a thread could never stop, run by the process executor:
a busy loop inside C that ignores SIGTERM, a 2 GB allocation, a segfault,
and the serving process itself SIGKILLed while its children run. Each job
fails with its cause, no process is left behind, and the process that
serves HTTP carries on (``jobdeck.worker.process_run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.maintenance.rescue import Rescue
from jobdeck.runtime import pool_for
from jobdeck.web.factory import create_app
from jobdeck.worker.pool import WorkerPool

from tests import process_handlers
from tests.adversarial.cli_process import ROOT, children, exited
from tests.conftest import wait_for

pytestmark = pytest.mark.backends


def make(make_config: Callable[..., Any], options: dict[str, dict[str, Any]], **config: Any) -> Jobdeck:
    registry = Registry()
    process_handlers.register(registry, **options)
    deck = Jobdeck(make_config(process_workers=1, **config), registry)
    deck.init_db()
    return deck


@contextmanager
def running(deck: Jobdeck) -> Iterator[WorkerPool]:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop(2.0)
        deck.store.engine.dispose()


def rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_busy_loop_in_c_deaf_to_sigterm_is_killed_at_its_timeout(make_config, tmp_path: Path) -> None:
    deck = make(make_config, {"proc.spins": {"timeout": 2}})
    job = deck.enqueue("proc.spins", {"pidfile": str(tmp_path / "spin")}).job
    with running(deck) as pool:
        child = int(wait_for(lambda: (tmp_path / "spin").exists() and (tmp_path / "spin").read_text(), timeout=30))
        began = time.monotonic()
        dead = wait_for(lambda: (j := deck.store.get(job.id)).status is State.DEAD and j, timeout=5)
        took = time.monotonic() - began
        assert dead.error == "timed out after 2 s; worker process killed"
        wait_for(lambda: exited(child), timeout=1, message="the spinning child is gone")
        assert child not in pool.executors.children.pids()
        assert pool.monitor.abandoned_threads() == 0
    print(f"busy C loop with SIGTERM blocked, timeout 2 s: failed {took:.1f} s after its start")


def test_two_gigabytes_past_a_256_mib_limit_fail_the_job_and_spare_the_server(make_config) -> None:
    deck = make(
        make_config, {"proc.allocates": {"max_retries": 2}}, types={"proc.allocates": {"memory_limit": "256 MiB"}}
    )
    client = create_app(deck=deck, init_db=False).test_client()
    before = rss(os.getpid())
    job = deck.enqueue("proc.allocates", {"bytes": 2 * 1024**3}).job
    with running(deck) as pool:
        dead = wait_for(lambda: (j := deck.store.get(job.id)).status is State.DEAD and j, timeout=30)
        assert dead.error.startswith("exceeded memory_limit 256 MiB (peak "), dead.error
        assert dead.retry_count == 0, "over its memory limit, a retry would fail the same way"
        assert client.get("/api/health").status_code == 200
        after = deck.enqueue("proc.echo", {"value": "still here"}).job
        ok = wait_for(lambda: (j := deck.store.get(after.id)).status is State.COMPLETED and j, timeout=30)
        assert ok.result["echo"] == "still here"
        assert pool.executors.children.restarts["memory"] == 1
    grown = rss(os.getpid()) - before
    assert grown < 200 * 1024**2, f"the serving process grew by {grown / 1024**2:.0f} MiB"
    print(f"{dead.error}; serving process grew {grown / 1024**2:.0f} MiB")


def test_a_segfault_in_a_child_fails_its_job_with_the_signal(make_config) -> None:
    deck = make(make_config, {})
    job = deck.enqueue("proc.segfaults", {}).job
    with running(deck):
        dead = wait_for(lambda: (j := deck.store.get(job.id)).status is State.DEAD and j, timeout=30)
        assert dead.error == "worker process exited with signal 11 (SIGSEGV)"
        after = deck.enqueue("proc.echo", {"value": 1}).job
        wait_for(lambda: deck.store.get(after.id).status is State.COMPLETED, timeout=30)


SERVING = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {root!r})
    from jobdeck.core.config import load
    from jobdeck.deck import Jobdeck
    from jobdeck.jobs.handlers import Registry
    from jobdeck.runtime import pool_for
    from tests import process_handlers

    registry = Registry()
    process_handlers.register(registry, **{{"proc.sleeps": {{"max_retries": 1}}, "proc.spins": {{"max_retries": 1}}}})
    config = load(path=None, env={{}}, overrides={config!r})
    deck = Jobdeck(config, registry)
    pool_for(deck, 3).start()
    threading.Event().wait()
    """
)


def test_sigkill_of_the_parent_leaves_no_child_and_its_jobs_are_rescued(make_config, tmp_path: Path) -> None:
    config = make_config(process_workers=3, heartbeat_interval=0.2, stall_timeout=1.0)
    registry = Registry()
    process_handlers.register(registry)
    deck = Jobdeck(config, registry)
    deck.init_db()
    sleeper = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "sleeper"), "seconds": 600}, max_retries=1).job
    spinner = deck.enqueue("proc.spins", {"pidfile": str(tmp_path / "spinner")}, max_retries=1).job
    script = tmp_path / "serving.py"
    overrides = {"database_url": config.database_url, "instance_path": str(tmp_path / "serving"), "workers": 3,
                 "process_workers": 3, "poll_interval": 0.05, "heartbeat_interval": 0.2, "stall_timeout": 1.0,
                 "secret_key": "test-secret"}  # fmt: skip
    script.write_text(SERVING.format(root=str(ROOT), config=overrides))
    serving = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        pids = [
            int(wait_for(lambda p=p: p.exists() and p.read_text(), timeout=60))
            for p in (tmp_path / "sleeper", tmp_path / "spinner")
        ]
        every_child = set(children(serving.pid))
        assert set(pids) <= every_child and len(every_child) == 3, every_child
        os.kill(serving.pid, signal.SIGKILL)
        serving.wait(10)
        began = time.monotonic()
        wait_for(
            lambda: all(exited(pid) for pid in every_child), timeout=10, message="every child died with its parent"
        )
        print(
            f"{len(every_child)} children (one busy in C, deaf to SIGTERM) gone {time.monotonic() - began:.2f} s after the SIGKILL"
        )
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.wait(10)
    rescue = Rescue(deck.store, deck.clock, 1.0)
    rescued: set[int] = set()
    wait_for(lambda: rescued.update(rescue.sweep_once(deck.clock())) or {sleeper.id, spinner.id} <= rescued, timeout=15)
    for job_id in (sleeper.id, spinner.id):
        assert deck.store.get(job_id).status is State.FAILED
        assert deck.store.attempts_of(job_id)[-1].outcome is AttemptOutcome.STALLED
    deck.store.engine.dispose()
