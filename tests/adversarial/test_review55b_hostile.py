"""Review of 8545a13/624a358: ``jobdeck serve`` (granian) exits 1 when its
stop had to kill the worker at the kill timeout.

That change decided "killed at the kill timeout" from the worker's exit
code alone (-SIGKILL), and only for a worker alive when the stop began.
These tests kill or crash the worker *during* the stop, long before the
timeout (both failed; the supervisor now notes granian's own kill, and a
worker that dies by a signal during the stop takes serve down by it), pin
what held, and stop serve by SIGHUP (granian's reload ran two runtimes).
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

import pytest
from jobdeck.core.states import State

from tests.adversarial.cli_process import JobdeckProcess, children, serving_a_job, write_config
from tests.conftest import wait_for

GRACE = 30.0  # the kill timeout is GRACE + KILL_MARGIN: far beyond these tests' stops


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _stop_with_a_running_job(tmp_path: Path, crash: int) -> tuple[int, float, str]:
    """serve with a long job running; SIGTERM; once the worker's runtime is
    stopping (the job kept within the grace), the worker dies by ``crash``."""
    with serving_a_job(tmp_path, 120, preexec_fn=_no_core, shutdown_grace=GRACE) as (proc, store, job_id):
        worker = children(proc.proc.pid)
        assert len(worker) == 1, worker
        proc.signal(signal.SIGTERM)
        proc.wait_logged("shutting down: finishing running jobs")
        os.kill(worker[0], crash)  # the OOM killer (SIGKILL), or a crash in native code (SIGSEGV)
        code, seconds = proc.wait_exit(timeout=GRACE)  # well before the kill timeout
        assert store.get(job_id).status is State.RUNNING  # not released: the stalled sweep must rescue it
        return code, seconds, proc.out()


@pytest.mark.slow
def test_a_worker_oom_killed_during_the_stop_is_not_reported_as_killed_at_the_kill_timeout(tmp_path: Path) -> None:
    """Failed, fixed. The worker is SIGKILLed by someone else (the OOM killer, an
    operator's ``kill -9``) a second into a stop whose kill timeout is
    ``shutdown_grace`` + 10 = 40 s away: serve dies by SIGKILL too. It was:
    ``_stop_workers`` saw exit code -SIGKILL and set ``killed_at_timeout``,
    so serve logged "the worker process
    did not stop within shutdown_grace + 10 s and was killed" - false: granian
    killed nothing (no "Killing worker" line), the stop took about a second;
    and it exited 1 with a message that sent the operator to look at a slow
    stop instead of memory."""
    code, seconds, output = _stop_with_a_running_job(tmp_path, signal.SIGKILL)
    assert "Killing worker" not in output, output  # granian did not kill it
    assert seconds < GRACE
    assert code == -signal.SIGKILL, f"exit {code}: serve did not die by its worker's signal\n{output}"
    assert "did not stop within shutdown_grace" not in output, (
        f"exit {code} after {seconds:.1f} s, the worker killed by someone else, yet serve blames the kill timeout:\n"
        f"{output}"
    )


@pytest.mark.slow
def test_a_worker_that_crashes_during_the_stop_does_not_give_a_clean_exit(tmp_path: Path) -> None:
    """Failed, fixed (the failure mode the commit set out to fix, by another path).
    The worker dies by SIGSEGV while its runtime waits out the grace for a
    running job: the job is never released (it stays ``running`` for the
    stalled sweep), and serve dies by SIGSEGV, as outside a stop. It was:
    ``killed_at_timeout`` looked for -SIGKILL only, and ``shutdown`` read the
    worker's exit code before the stop, so serve exited 0, and the service
    manager took the stop for a clean one."""
    code, seconds, output = _stop_with_a_running_job(tmp_path, signal.SIGSEGV)
    assert code == -signal.SIGSEGV, f"exit {code} after {seconds:.1f} s though the worker crashed mid-stop:\n{output}"


@pytest.mark.slow
def test_held_a_worker_oom_killed_before_the_stop_still_takes_serve_down_by_sigkill(tmp_path: Path) -> None:
    """HELD (pins a guarantee). The worker SIGKILLed while serving, no stop
    begun: serve dies by SIGKILL, as the module docstring says, and does not
    blame the kill timeout (the worker was dead before ``_stop_workers``)."""
    config = write_config(tmp_path, shutdown_grace=5.0, workers=1, http_server="granian")
    proc = JobdeckProcess(tmp_path, config, "serve")
    try:
        proc.wait_serving()
        worker = children(proc.proc.pid)
        assert len(worker) == 1, worker
        os.kill(worker[0], signal.SIGKILL)
        code, _ = proc.wait_exit(timeout=30)
        output = proc.out()
        assert code == -signal.SIGKILL, f"exit {code}:\n{output}"
        assert "did not stop within shutdown_grace" not in output, output
    finally:
        proc.kill()


@pytest.mark.slow
def test_held_a_stop_that_takes_most_of_the_grace_exits_0(tmp_path: Path) -> None:
    """HELD (pins a guarantee). A running job that finishes a second before
    ``shutdown_grace`` ends: the stop is clean, serve exits 0 and logs no
    kill-timeout error."""
    grace = 4.0
    with serving_a_job(tmp_path, grace - 1, shutdown_grace=grace) as (proc, store, job_id):
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + 20)
        output = proc.out()
        assert code == 0, f"exit {code} after {seconds:.1f} s:\n{output}"
        assert "did not stop within shutdown_grace" not in output, output
        assert store.get(job_id).status is State.COMPLETED, output


@pytest.mark.slow
def test_sighup_stops_serve_and_never_runs_two_job_runtimes_at_once(tmp_path: Path) -> None:
    """SIGHUP (a terminal's hang-up) stops ``jobdeck serve`` as SIGTERM
    does: the running job is released at the end of the grace and serve
    exits 0, with no second worker process ever forked.

    The review found granian's SIGHUP reload forking a new worker, whose
    ``_load`` started a second runtime (worker pool and scheduler), before
    it sent SIGTERM to the old worker, whose runtime then finished its
    running jobs for up to ``shutdown_grace``: two pools and two
    schedulers at once, where the module promises one per serve."""
    grace = 3.0
    with serving_a_job(tmp_path, 120, log_level="info", shutdown_grace=grace) as (proc, store, job_id):
        old = children(proc.proc.pid)
        assert len(old) == 1, old
        proc.signal(signal.SIGHUP)
        forked: set[int] = set()

        def exited() -> bool:
            forked.update(pid for pid in children(proc.proc.pid) if pid != old[0])
            return proc.proc.poll() is not None

        wait_for(exited, grace + 20, interval=0.02, message="serve to stop on SIGHUP")
        output = proc.out()
        assert not forked, f"SIGHUP forked worker(s) {sorted(forked)} beside {old[0]}:\n{output}"
        assert proc.proc.returncode == 0, output
        assert store.get(job_id).status is State.PENDING, f"{store.get(job_id).status}: not released\n{output}"
