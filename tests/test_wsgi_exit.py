"""``jobdeck.wsgi`` in a real process that exits, as a gunicorn worker does:
its runtime stops before Python refuses new work to ``concurrent.futures``,
so nothing it was running or about to run fails on the way out."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a process of its own


def test_a_process_that_imports_the_wsgi_app_and_exits_stops_its_runtime_cleanly(tmp_path: Path) -> None:
    # The maintenance jobs' first runs are due at start: they come due while the process exits.
    env = {"PATH": os.environ["PATH"], "JOBDECK_INSTANCE_PATH": str(tmp_path), "JOBDECK_BIND": "127.0.0.1:8000",
           "JOBDECK_DATABASE_URL": f"sqlite:///{tmp_path / 'jobdeck.db'}", "JOBDECK_WORKERS": "2"}  # fmt: skip
    code = "import jobdeck.wsgi; print('started', jobdeck.wsgi.runtime.pool is not None)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started True"
    assert "Traceback" not in done.stderr and "Error submitting job" not in done.stderr, done.stderr
    with closing(sqlite3.connect(tmp_path / "jobdeck.db")) as db:  # the pool's stop wrote its last state
        assert [row[0] is not None for row in db.execute("SELECT stopped_at FROM workers")] == [True]


SLOW_JOBS = """
import time
from jobdeck import handler

@handler("slow.sleep", max_retries=0)
def sleep(payload, ctx):
    time.sleep(payload["seconds"])  # deaf to ctx.cancelled: only the stop's end can take it back
"""

QUIT_MID_STOP = """
import os, signal, sys, threading, time
signal.signal(signal.SIGQUIT, lambda *_: sys.exit(0))  # as a gunicorn worker does
import jobdeck.wsgi
deck, pool = jobdeck.wsgi.runtime.deck, jobdeck.wsgi.runtime.pool
job, _ = deck.enqueue("slow.sleep", {"seconds": 120})
deadline = time.monotonic() + 60
while deck.store.get(job.id).status.value != "running" and time.monotonic() < deadline:
    time.sleep(0.02)
print(job.id, deck.store.get(job.id).status.value, flush=True)

def quit_mid_stop():  # the signal comes while the stop at exit waits out its grace
    pool._stopping.wait(60)
    os.kill(os.getpid(), signal.SIGQUIT)

threading.Thread(target=quit_mid_stop, daemon=True).start()
"""


def test_a_signal_during_the_stop_at_exit_releases_the_running_jobs_at_once(tmp_path: Path) -> None:
    """A gunicorn worker told to quit (SIGQUIT, Ctrl-C) during its graceful
    stop raises SystemExit inside it: the stop hurries, the running job is
    released now and not after the 60 s grace, and Python's exit goes on."""
    (tmp_path / "slowjobs.py").write_text(SLOW_JOBS)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "JOBDECK_INSTANCE_PATH": str(tmp_path),
           "JOBDECK_BIND": "127.0.0.1:8000", "JOBDECK_DATABASE_URL": f"sqlite:///{tmp_path / 'jobdeck.db'}",
           "JOBDECK_WORKERS": "1", "JOBDECK_SHUTDOWN_GRACE": "60", "JOBDECK_HANDLER_MODULES": "slowjobs"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", QUIT_MID_STOP], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        job_id, status = proc.stdout.readline().split()
        assert status == "running"
        exiting = time.monotonic()
        out, err = proc.communicate(timeout=40)  # the grace is 60 s: only a hurried stop ends within this
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert time.monotonic() - exiting < 40
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert "the runtime's stop at exit was cut short" in err, err
    with closing(sqlite3.connect(tmp_path / "jobdeck.db")) as db:
        [(status,)] = db.execute("SELECT status FROM jobs WHERE id = ?", (int(job_id),)).fetchall()
    assert status == "pending"  # released, to run again elsewhere
