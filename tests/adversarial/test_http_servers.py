"""``jobdeck serve`` on each of its HTTP servers (``http_server``: waitress,
the default, and granian, the opt-in extra), as real processes.

- SIGTERM lets a running job finish inside ``shutdown_grace``, and the
  process exits 0 with the pool's row marked stopped;
- the pool and the scheduler start once per ``jobdeck serve``: with
  granian in its one worker process, never in the supervisor;
- a job still running at the end of the grace is released, not lost.

The idle-connection property is ``test_server_limits.py`` and SIGTERM
under traffic ``test_signals.py``, both run on each server.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS
from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import workers
from sqlalchemy import select

from tests.adversarial.cli_process import JobdeckProcess, children, exited, write_config
from tests.conftest import wait_for


def _store(tmp_path: Path) -> Store:
    return Store(make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2))


def _pools(store: Store) -> list[tuple[str, int, datetime | None]]:
    with store.read() as conn:
        rows = conn.execute(select(workers.c.id, workers.c.pid, workers.c.stopped_at)).all()
    return [(r.id, r.pid, r.stopped_at) for r in rows]


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_sigterm_lets_the_running_job_finish_within_the_grace(tmp_path: Path, server: str) -> None:
    grace = 20.0
    proc = JobdeckProcess(tmp_path, write_config(tmp_path, http_server=server, workers=1, shutdown_grace=grace))
    store = _store(tmp_path)
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 2}), datetime.now(UTC))[0].id

        def running() -> bool:
            proc.alive()
            return store.get(job_id).status is State.RUNNING

        wait_for(running, 30, interval=0.02, message="the sleep job to run")
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + 15)
        output = proc.out()
        assert code == 0, f"exit code {code}:\n{output}"
        assert "Traceback" not in output, output
        assert seconds < grace, f"took {seconds:.1f} s, past shutdown_grace {grace} s"
        assert store.get(job_id).status is State.COMPLETED, "the running job was not let finish"
        pools = _pools(store)
        assert len(pools) == 1 and pools[0][2] is not None, f"the pool did not stop gracefully: {pools}"
        print(f"\n{server}: SIGTERM with a 2 s job running -> completed, exit 0 in {seconds:.2f} s")
    finally:
        proc.kill()
        store.engine.dispose()


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_a_job_running_past_the_grace_is_released(tmp_path: Path, server: str) -> None:
    grace = 1.0
    proc = JobdeckProcess(tmp_path, write_config(tmp_path, http_server=server, workers=1, shutdown_grace=grace))
    store = _store(tmp_path)
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 120}, max_retries=3), datetime.now(UTC))[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + 15)
        assert code == 0, f"exit code {code}:\n{proc.out()}"
        job = store.get(job_id)
        assert job.status is State.PENDING and job.retry_count == 0 and job.worker_id is None
        print(f"\n{server}: a 120 s job at SIGTERM (grace {grace:g} s) -> released, exit 0 in {seconds:.2f} s")
    finally:
        proc.kill()
        store.engine.dispose()


def test_granian_starts_the_pool_and_scheduler_once_in_its_worker_process(tmp_path: Path) -> None:
    proc = JobdeckProcess(tmp_path, write_config(tmp_path, http_server="granian", workers=2), log_level="info")
    store = _store(tmp_path)
    try:
        proc.wait_serving()
        forked = wait_for(lambda: proc.alive() and children(proc.proc.pid), 10, message="granian's worker")
        assert len(forked) == 1, f"expected one worker process, found {forked}"
        wait_for(lambda: len(_pools(store)) >= 1, 10, message="the pool's row")
        for _ in range(3):  # the pool answers requests from the worker; nothing else registers one
            assert proc.health()["ok"] is True
        pools = _pools(store)
        assert [pid for _, pid, _ in pools] == forked, f"pools {pools}, supervisor {proc.proc.pid}"
        assert proc.out().count("scheduler started") == 1, proc.out()
        assert len(re.findall(r"worker pool \S+ started", proc.out())) == 1, proc.out()

        proc.signal(signal.SIGTERM)
        code, _ = proc.wait_exit(timeout=30)
        assert code == 0, proc.out()
        assert all(stopped is not None for _, _, stopped in _pools(store))
        wait_for(lambda: exited(forked[0]), 10, message="the worker process to exit")
    finally:
        proc.kill()
        store.engine.dispose()


def test_a_killed_granian_supervisor_takes_its_worker_with_it_at_once(tmp_path: Path) -> None:
    """SIGKILL of ``jobdeck serve`` is a crash of all of it, as with waitress:
    the worker dies too (no graceful stop: its pool row stays unstopped for
    the stalled sweep) and the port is free for a restart at once."""
    config = write_config(tmp_path, http_server="granian", workers=1)
    proc = JobdeckProcess(tmp_path, config)
    store = _store(tmp_path)
    again: JobdeckProcess | None = None
    try:
        proc.wait_serving()
        child = wait_for(lambda: children(proc.proc.pid), 10, message="granian's worker")[0]
        wait_for(lambda: len(_pools(store)) == 1, 10, message="the pool's row")
        proc.kill()  # SIGKILL: no chance to stop its worker
        wait_for(lambda: exited(child), 10, interval=0.02, message="the worker to die with its supervisor")
        assert [stopped for _, _, stopped in _pools(store)] == [None], "the worker stopped gracefully: not a crash"
        again = JobdeckProcess(tmp_path, config, name="again", port=proc.port)
        again.wait_serving(timeout=30)  # the dead worker's listening socket is gone with it
    finally:
        proc.kill()
        if again is not None:
            again.kill()
        store.engine.dispose()


def test_a_killed_granian_worker_takes_its_supervisor_with_it_by_the_same_signal(tmp_path: Path) -> None:
    """A crash of the worker (here SIGKILL, as the OOM killer sends) is a
    crash of ``jobdeck serve``: whatever supervises it sees the same signal."""
    proc = JobdeckProcess(tmp_path, write_config(tmp_path, http_server="granian", workers=1))
    try:
        proc.wait_serving()
        child = wait_for(lambda: children(proc.proc.pid), 10, message="granian's worker")[0]
        os.kill(child, signal.SIGKILL)
        code, _ = proc.wait_exit(timeout=30)
        assert code == -signal.SIGKILL, f"exit code {code}:\n{proc.out()}"
        assert "killed by signal 9" in proc.out(), proc.out()
    finally:
        proc.kill()
