"""The suite's own plugin (tests/tiers.py): a held test process starts when
its file appears, and the first process takes over its queued tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run of its own, with two test processes

TESTS = 12
DEADLINE_SECONDS = 120

INNER = """
import os, pytest

@pytest.mark.parametrize("n", range({tests}))
def test_n(n):
    with open(os.environ["TIERS_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def _ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_held_process_waits_for_its_file_while_the_first_runs_its_tests(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER.format(tests=TESTS))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.tiers"]\n')
    log, release = tmp_path / "ran.log", tmp_path / "release"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TIERS_LOG": str(log), "JOBDECK_TEST_HOLD": str(release), "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider",
               "-p", "no:randomly", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)]  # fmt: skip
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        # The first process runs every test but the one the held process was
        # given to start on and the one after it (xdist hands each its next).
        while len(_ran(log)) < TESTS - 2 and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()[0]
            time.sleep(0.05)
        before = _ran(log)
        assert len(before) >= TESTS - 2, f"the first process ran {before} before the release"
        assert set(before) == {"gw0"}, f"a held process ran a test before its file appeared: {before}"
        release.touch()
        output, _ = run.communicate(timeout=DEADLINE_SECONDS)
    finally:
        run.kill()
    assert run.returncode == 0, output
    ran = _ran(log)
    assert len(ran) == TESTS and ran.count("gw1") >= 1, ran
