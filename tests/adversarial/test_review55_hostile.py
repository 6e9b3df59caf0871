"""Review 55, hostile: granian's worker resends its SIGTERM to itself
(``_watch_stops``) when the supervisor counted a stop and the worker's
serve loop still runs ``RESEND_AFTER`` (3 s) later.

The loop legitimately runs on after a stop while granian drains the
requests in progress: a client still uploading its body, for one. The
watcher takes that drain for a lost signal and sends SIGTERM again every
3 s; granian's worker does not treat those copies as harmless, and a
graceful stop that was fine before the change now drops the request in
progress, never runs the runtime's graceful stop, and ends with the
supervisor killing the worker after ``shutdown_grace`` + ``KILL_MARGIN``.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.conftest import wait_for


def _slow_upload(port: int, seconds: float, result: list[bytes | str]) -> threading.Event:
    """POST a small body a byte at a time over ``seconds`` (a slow mobile
    client); ``result`` gets the response's first bytes, or the error.
    Returns an event set once the headers and the first bytes are sent."""
    started = threading.Event()
    body = json.dumps({"type": "demo.noop", "payload": {"pad": "x" * 60}}).encode()

    def run() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(
                    b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                )
                s.sendall(body[:5])
                started.set()
                pause = seconds / (len(body) - 5)
                for i in range(5, len(body)):
                    s.sendall(body[i : i + 1])
                    time.sleep(pause)
                result.append(s.recv(200))
        except OSError as exc:
            result.append(f"{type(exc).__name__}: {exc}")
            started.set()

    threading.Thread(target=run, daemon=True).start()
    return started


@pytest.mark.slow  # a real ``jobdeck serve``, stopped during a drain of several seconds
def test_a_stop_during_a_slow_upload_stays_graceful(tmp_path: Path) -> None:
    """FAILS on review55's change. A SIGTERM while a client still uploads
    its body (8 s) and a job runs (10 s): before the change, the request was
    answered, the job finished, and ``serve`` exited 0 in about 11 s. With
    ``_watch_stops``, the worker resends SIGTERM to itself at 3 s and 6 s
    ("its signal was lost") although nothing was lost; the drain is cut,
    the upload gets no answer, the runtime's graceful stop never runs
    ("shutting down: finishing running jobs" is never printed) and the
    supervisor kills the worker after its kill timeout (grace + 10 s),
    leaving the job RUNNING for the stall sweep.

    The mechanism, outside jobdeck's code: granian 2.8.9's worker survives
    one extra SIGTERM during a drain, but not two (the code before the
    change, given two SIGTERMs sent to the worker at 3.5 s and 6.5 s of such
    a drain, hangs the same way). The watcher sends one every 3 s, so any
    drain longer than about 6.5 s hangs the worker."""
    grace = 20.0
    config = write_config(
        tmp_path, shutdown_grace=grace, workers=1, http_server="granian", http_body_timeout=60.0, demo=True
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2)
    store = Store(engine)
    proc = JobdeckProcess(tmp_path, config, "serve", log_level="info")
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 10}, max_retries=3), datetime.now(UTC))[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        answer: list[bytes | str] = []
        assert _slow_upload(proc.port, 8.0, answer).wait(10)
        time.sleep(0.3)  # the request is in progress in the worker
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + 30)
        wait_for(lambda: bool(answer), 10, message="the upload's answer")
        output = proc.out()
        status = store.get(job_id).status
        problems = [
            text
            for text, bad in [
                (
                    f"the upload got {answer[0]!r}, not an answer",
                    not (isinstance(answer[0], bytes) and answer[0].startswith(b"HTTP/1.1 ")),
                ),
                ("the runtime's graceful stop never ran", "shutting down: finishing running jobs" not in output),
                (f"exit {code} after {seconds:.1f} s (grace {grace} s)", code != 0 or seconds >= grace),
                (f"the running job was left {status.value}", status is not State.COMPLETED),
                ("a drain taken for a lost signal", "signal was lost" in output),
            ]
            if bad
        ]
        assert not problems, "; ".join(problems) + f"\n{output}"
    finally:
        proc.kill()
        engine.dispose()


@pytest.mark.slow  # a real ``jobdeck serve``, stopped while a job runs 8 s
def test_a_long_runtime_stop_after_the_loop_ended_gets_no_resent_signal(tmp_path: Path) -> None:
    """PASSES (pins a guarantee of the change). With no request in
    progress the serve loop ends at once on SIGTERM, and the watcher with
    it: the runtime's stop then waits its 8 s for the running job without
    any resent signal ("signal was lost" never logged), the job completes
    and ``serve`` exits 0 within the grace."""
    grace = 20.0
    config = write_config(tmp_path, shutdown_grace=grace, workers=1, http_server="granian", demo=True)
    engine = make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2)
    store = Store(engine)
    proc = JobdeckProcess(tmp_path, config, "serve", log_level="info")
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 8}, max_retries=3), datetime.now(UTC))[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        proc.signal(signal.SIGTERM)
        code, seconds = proc.wait_exit(timeout=grace + 30)
        output = proc.out()
        assert code == 0 and seconds < grace, (code, seconds, output)
        assert "signal was lost" not in output, output
        assert "shutting down: finishing running jobs" in output, output
        assert store.get(job_id).status is State.COMPLETED, output
    finally:
        proc.kill()
        engine.dispose()


@pytest.mark.slow  # a real ``jobdeck serve``, stopped twice during a slow upload
def test_a_second_ctrl_c_during_a_slow_upload_releases_the_job_at_once(tmp_path: Path) -> None:
    """FAILS on review55's change. Ctrl-C, then Ctrl-C again to release the
    running job now, while a client uploads its body for 5 s. Before the
    change the worker got two SIGTERMs (the supervisor's first and second),
    answered the upload, released the job (pending again) and ``serve``
    exited 0 about 5 s after the first signal. With ``_watch_stops`` the
    watcher adds a third SIGTERM 3 s in, which granian's worker does not
    survive during a drain: no answer, no release, and the supervisor kills
    the worker after grace + 10 s, the job left RUNNING."""
    grace = 10.0
    config = write_config(
        tmp_path, shutdown_grace=grace, workers=1, http_server="granian", http_body_timeout=60.0, demo=True
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2)
    store = Store(engine)
    proc = JobdeckProcess(tmp_path, config, "serve", log_level="info")
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": 120}, max_retries=3), datetime.now(UTC))[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        answer: list[bytes | str] = []
        assert _slow_upload(proc.port, 5.0, answer).wait(10)
        time.sleep(0.3)
        proc.signal(signal.SIGINT)
        time.sleep(1.0)
        proc.signal(signal.SIGINT)  # again: release the running job now
        code, seconds = proc.wait_exit(timeout=grace + 30)
        wait_for(lambda: bool(answer), 10, message="the upload's answer")
        output = proc.out()
        status = store.get(job_id).status
        problems = [
            text
            for text, bad in [
                (
                    f"the upload got {answer[0]!r}, not an answer",
                    not (isinstance(answer[0], bytes) and answer[0].startswith(b"HTTP/1.1 ")),
                ),
                ("the runtime's stop never ran", "shutting down: finishing running jobs" not in output),
                (f"exit {code} {seconds:.1f} s after the second signal", code != 0 or seconds >= grace),
                (f"the job was left {status.value}, not released", status is not State.PENDING),
            ]
            if bad
        ]
        assert not problems, "; ".join(problems) + f"\n{output}"
    finally:
        proc.kill()
        engine.dispose()
