"""The suite's own plugin (``tests/tiers.py``) as a parallel run shows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRINTS = "tests/adversarial/test_embedding_attacks.py::test_path_tricks_do_not_reach_jobdeck"
"""A short adversarial test that prints its figure ("N path tricks, statuses: ...")."""
FILE, _, NAME = PRINTS.partition("::")


@pytest.mark.slow  # another interpreter: a pytest run with two test processes
def test_a_parallel_run_prints_the_adversarial_figures() -> None:
    """The run's summary carries what each passed adversarial test printed.
    Under xdist the summary is the controller's, which loads only the
    plugins and the top conftest: hooks in ``tests/adversarial/conftest.py``
    never ran there, and the section was missing from CI's log."""
    # Started as the full run is, on ``tests`` (a test's own path as the
    # argument would load its folder's conftest in the controller too), with
    # only its file collected.
    only = ["-o", f"python_files={Path(FILE).name}", "-k", NAME]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", *only, "tests"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    section = result.stdout.partition("adversarial figures")[2]
    assert section, f"no 'adversarial figures' section:\n{result.stdout}"
    assert f"{PRINTS}:" in section and "path tricks, statuses:" in section, section
