"""Review of 8545a13/624a358: ``jobdeck serve`` (granian) exits 1 when its
stop had to kill the worker at the kill timeout.

The override decides "killed at the kill timeout" from the worker's exit code
alone (-SIGKILL), and only for a worker alive when the stop began. These
tests kill or crash the worker *during* the stop, long before the timeout.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine

from tests.adversarial.cli_process import JobdeckProcess, children, write_config
from tests.conftest import wait_for

GRACE = 30.0  # the kill timeout is GRACE + KILL_MARGIN: far beyond these tests' stops


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _stop_with_a_running_job(tmp_path: Path, crash: int) -> tuple[int, float, str]:
    """serve with a long job running; SIGTERM; once the worker's runtime is
    stopping (the job kept within the grace), the worker dies by ``crash``."""
    config = write_config(tmp_path, shutdown_grace=GRACE, workers=1, http_server="granian")
    proc = JobdeckProcess(tmp_path, config, "serve", preexec_fn=_no_core)
    engine = make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2)
    store = Store(engine)
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 120}, max_retries=3), _now())[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        worker = children(proc.proc.pid)
        assert len(worker) == 1, worker
        proc.signal(signal.SIGTERM)
        proc.wait_logged("shutting down: finishing running jobs")
        os.kill(worker[0], crash)  # the OOM killer (SIGKILL), or a crash in native code (SIGSEGV)
        code, seconds = proc.wait_exit(timeout=GRACE)  # well before the kill timeout
        assert store.get(job_id).status is State.RUNNING  # not released: the stalled sweep must rescue it
        return code, seconds, proc.out()
    finally:
        proc.kill()
        engine.dispose()


@pytest.mark.slow
def test_a_worker_oom_killed_during_the_stop_is_not_reported_as_killed_at_the_kill_timeout(tmp_path: Path) -> None:
    """DEFECT. The worker is SIGKILLed by someone else (the OOM killer, an
    operator's ``kill -9``) a second into a stop whose kill timeout is
    ``shutdown_grace`` + 10 = 40 s away. ``_stop_workers`` sees exit code
    -SIGKILL and sets ``killed_at_timeout``, so serve logs "the worker process
    did not stop within shutdown_grace + 10 s and was killed" - false: granian
    killed nothing (no "Killing worker" line), the stop took about a second.
    The module docstring says a worker killed by a signal (a crash, the OOM
    killer) takes serve with it by the same signal; here serve exits 1 with a
    message that sends the operator to look at a slow stop instead of memory."""
    code, seconds, output = _stop_with_a_running_job(tmp_path, signal.SIGKILL)
    assert "Killing worker" not in output, output  # granian did not kill it
    assert seconds < GRACE
    assert "did not stop within shutdown_grace" not in output, (
        f"exit {code} after {seconds:.1f} s, the worker killed by someone else, yet serve blames the kill timeout:\n"
        f"{output}"
    )


@pytest.mark.slow
def test_a_worker_that_crashes_during_the_stop_does_not_give_a_clean_exit(tmp_path: Path) -> None:
    """DEFECT (the failure mode the commit sets out to fix, by another path).
    The worker dies by SIGSEGV while its runtime waits out the grace for a
    running job: the job is never released (it stays ``running`` for the
    stalled sweep), exactly what a kill at the kill timeout leaves behind.
    ``killed_at_timeout`` only looks for -SIGKILL, and ``shutdown`` reads the
    worker's exit code before the stop, so serve exits 0: the service manager
    takes a stop whose running jobs were never released, and whose worker
    crashed, for a clean one. (Outside a stop a SIGSEGV takes serve down by
    SIGSEGV.)"""
    code, seconds, output = _stop_with_a_running_job(tmp_path, signal.SIGSEGV)
    assert code != 0, f"exit {code} after {seconds:.1f} s though the worker crashed mid-stop:\n{output}"
