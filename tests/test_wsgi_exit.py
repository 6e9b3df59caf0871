"""``jobdeck.wsgi`` in a real process that exits, as a gunicorn worker does:
its runtime stops before Python refuses new work to ``concurrent.futures``,
so nothing it was running or about to run fails on the way out."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
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
