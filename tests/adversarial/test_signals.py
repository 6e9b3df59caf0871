"""SIGTERM and Ctrl-C stop ``jobdeck serve`` and ``jobdeck worker`` every
time, cleanly.

Before: the handler raised ``Shutdown(BaseException)`` into whatever the
main thread ran, waitress's bare ``except:`` clauses swallowed it during
traffic (the server kept running), and a second Ctrl-C printed a traceback
and stranded the running job until the stall rescue.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS
from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import attempts, jobs
from sqlalchemy import select

from tests.adversarial.cli_process import JobdeckProcess, children, write_config
from tests.conftest import wait_for

GRACE = 5.0
ROUNDS = 10


def _traffic(port: int, stop: threading.Event, answered: list[int]) -> None:
    """Keep-alive requests (health, an enqueue) until the server goes away."""
    body = json.dumps({"type": "demo.noop", "payload": {}})
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            while not stop.is_set():
                conn.request("GET", "/api/health")
                conn.getresponse().read()
                conn.request("POST", "/api/jobs", body, {"content-type": "application/json"})
                conn.getresponse().read()
                answered.append(1)
        except (OSError, http.client.HTTPException):
            if stop.wait(0.01):  # the server is going away; try a new connection
                return
        finally:
            conn.close()  # a connection the server dropped mid-request still holds its socket


@pytest.mark.alone  # each stop is timed against shutdown_grace
@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_sigterm_under_traffic_stops_the_server_every_time(tmp_path: Path, http_server: str) -> None:
    config = write_config(tmp_path, shutdown_grace=GRACE, http_threads=4, http_server=http_server)
    took: list[float] = []
    for n in range(ROUNDS):
        server = JobdeckProcess(tmp_path, config, name=f"serve{n}")
        stop = threading.Event()
        answered: list[int] = []
        clients = [threading.Thread(target=_traffic, args=(server.port, stop, answered)) for _ in range(4)]
        try:
            server.wait_serving()
            for c in clients:
                c.start()
            wait_for(lambda: len(answered) >= 20, 30, message="traffic to flow")  # noqa: B023
            server.signal(signal.SIGTERM)
            try:
                code, seconds = server.wait_exit(timeout=GRACE + 1)
            except Exception as exc:
                raise AssertionError(f"round {n}: still running {GRACE + 1} s after SIGTERM:\n{server.out()}") from exc
            took.append(seconds)
            assert code == 0, f"round {n}: exit code {code}:\n{server.out()}"
            assert "Traceback" not in server.out(), f"round {n}:\n{server.out()}"
            assert seconds <= GRACE, f"round {n}: took {seconds:.2f} s (shutdown_grace {GRACE} s)"
        finally:
            stop.set()
            server.kill()
            for c in clients:
                if c.is_alive():
                    c.join(timeout=10)
    print(
        f"\n{http_server}: SIGTERM under traffic, {ROUNDS} rounds: all exit 0, stops took "
        f"{', '.join(f'{t:.2f}' for t in took)} s (grace {GRACE} s)"
    )


@pytest.mark.parametrize(
    ("command", "second", "server"),
    [("serve", signal.SIGINT, "granian"), ("serve", signal.SIGINT, "waitress"), ("worker", signal.SIGTERM, "granian")],
    ids=["serve-sigint", "serve-waitress-sigint", "worker-sigterm"],
)
def test_a_second_signal_releases_the_running_job_at_once(
    tmp_path: Path, command: str, second: int, server: str
) -> None:
    grace = 60.0  # without the second signal the stop would wait this long for the job
    config = write_config(tmp_path, shutdown_grace=grace, workers=1, http_server=server)
    url = f"sqlite:///{tmp_path / 'jobdeck.db'}"
    proc = JobdeckProcess(tmp_path, config, command)
    engine = make_engine(url, pool_size=2)
    store = Store(engine)
    try:
        proc.wait_logged("Jobdeck")  # the banner: the schema exists and the pool is started
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 120}, max_retries=3), _now())[0].id

        def running() -> bool:
            proc.alive()
            return store.get(job_id).status is State.RUNNING

        wait_for(running, 30, interval=0.05, message="the sleep job to run")
        proc.signal(signal.SIGTERM)
        proc.wait_logged("shutting down")
        proc.signal(second)
        code, seconds = proc.wait_exit(timeout=15)
        output = proc.out()
        assert code == 0, f"exit code {code}:\n{output}"
        assert "Traceback" not in output and 'File "' not in output, output
        assert seconds < 10, f"took {seconds:.1f} s after the second signal"

        job = store.get(job_id)
        assert job.status is State.PENDING and job.retry_count == 0 and job.worker_id is None
        with store.read() as conn:
            rows = conn.execute(
                select(attempts.c.attempt, attempts.c.outcome, attempts.c.error).where(attempts.c.job_id == job_id)
            ).all()
            attempt = conn.execute(select(jobs.c.attempt).where(jobs.c.id == job_id)).scalar_one()
        assert [tuple(r) for r in rows] == [(1, "interrupted", "interrupted by shutdown")]
        assert attempt == 1, "the interrupted attempt stays counted; the next run is attempt 2"
        print(
            f"\n{command} ({server}): second signal -> exit 0 in {seconds:.2f} s, job {job_id} pending with an interrupted attempt"
        )
    finally:
        proc.kill()
        engine.dispose()


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_a_sigterm_while_the_worker_starts_stops_serve(tmp_path: Path) -> None:
    """granian installs its worker's signal handlers only once the app is
    built and the runtime running. A SIGTERM that reached the worker before
    then met the supervisor's handlers the fork had copied and was lost: the
    worker served on, running jobs, until the supervisor killed it
    ``shutdown_grace`` + 10 s later and ``serve`` died by SIGKILL."""
    grace = 5.0
    config = write_config(
        tmp_path,
        shutdown_grace=grace,
        http_server="granian",
        handler_modules=["tests.adversarial.fork_gate_handlers"],
    )
    proc = JobdeckProcess(tmp_path, config, "serve", log_level="info")
    try:
        wait_for(lambda: proc.alive() and any(tmp_path.glob("forked.*")), 60, message="the worker to be forked")
        proc.signal(signal.SIGTERM)
        proc.wait_logged("Shutting down granian")  # the supervisor passes the SIGTERM on right after this line
        (tmp_path / "go").write_text("")  # the worker builds the app and starts its runtime now
        code, seconds = proc.wait_exit(timeout=grace + 20)
        output = proc.out()
        assert code == 0, f"exit code {code} after {seconds:.1f} s:\n{output}"
        assert "shutting down: finishing running jobs" in output, output
        assert "Killing worker" not in output, output
        assert seconds < grace, f"took {seconds:.1f} s: the worker did not stop on the signal\n{output}"
    finally:
        proc.kill()


def test_a_service_manager_that_signals_every_process_gets_a_graceful_stop(tmp_path: Path) -> None:
    """systemd's default (``KillMode=control-group``) sends SIGTERM to every
    process of the service: granian's worker got one from the service
    manager and one from the supervisor, took the second for "release the
    running jobs now", and a stop meant to let them finish cut them short.
    The worker counts the supervisor's signals, not the copies it gets."""
    config = write_config(tmp_path, shutdown_grace=30.0, workers=1, http_server="granian")
    url = f"sqlite:///{tmp_path / 'jobdeck.db'}"
    proc = JobdeckProcess(tmp_path, config, "serve")
    engine = make_engine(url, pool_size=2)
    store = Store(engine)
    try:
        proc.wait_logged("Jobdeck")
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 2}, max_retries=3), _now())[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        children = Path(f"/proc/{proc.proc.pid}/task/{proc.proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        for pid in (proc.proc.pid, int(children[0])):  # as the service manager does: every process
            os.kill(pid, signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=30)
        assert code == 0, proc.out()
        job = store.get(job_id)
        assert job.status is State.COMPLETED, f"{job.status}: the running job was not let finish\n{proc.out()}"
    finally:
        proc.kill()
        engine.dispose()


@pytest.mark.slow  # a real jobdeck serve, and its kill timeout
def test_serve_exits_non_zero_when_its_stop_had_to_kill_the_worker(tmp_path: Path) -> None:
    """A granian worker that cannot stop (here frozen by SIGSTOP) is killed
    at the supervisor's kill timeout, ``shutdown_grace`` + ``KILL_MARGIN``.
    Its runtime never finished its stop (running jobs not released), so
    ``jobdeck serve`` exits 1 and says so: it exited 0, and a service
    manager took the stop for a clean one."""
    from jobdeck.web.granian_server import KILL_MARGIN

    grace = 1.0
    config = write_config(tmp_path, shutdown_grace=grace, workers=1, http_server="granian")
    proc = JobdeckProcess(tmp_path, config, "serve")
    try:
        proc.wait_serving()
        worker = children(proc.proc.pid)
        assert len(worker) == 1, worker
        os.kill(worker[0], signal.SIGSTOP)
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + KILL_MARGIN + 30)
        output = proc.out()
        assert code == 1, f"exit {code} after {seconds:.1f} s\n{output}"
        assert seconds >= grace + KILL_MARGIN - 1, (
            f"exit after {seconds:.1f} s: the worker was not waited for\n{output}"
        )
        assert "did not stop within shutdown_grace" in output, output
    finally:
        proc.kill()
