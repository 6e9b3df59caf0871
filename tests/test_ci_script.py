"""``.ci/run`` runs the README's test command verbatim, and fails when any
step of it fails. A failed step inside an ``&&`` list does not stop a
``set -e`` script; CI once reported the full run as passed in 1 s after its
``apt-get`` failed, with no test run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CI = REPO / ".ci" / "run"


def readme_test_command() -> str:
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    return blocks[1].strip()


def ci_step() -> str:
    """The lines of .ci/run that run the README's command and check it."""
    text = CI.read_text(encoding="utf-8")
    start = text.index("started=$SECONDS\n")
    end = text.index("\n", text.index("echo \"== the README's test command passed"))
    return text[start:end]


def test_ci_runs_the_readme_command_verbatim() -> None:
    command = readme_test_command()
    assert command.startswith("apt-get") and command.endswith("python3 -m pytest")
    assert f"\n{command} || status=$?\n" in ci_step()


def run_step(tmp_path: Path, failing: str | None) -> subprocess.CompletedProcess[str]:
    """The step, with every program it calls replaced by one that prints its
    name and succeeds, or fails with 7 when it is ``failing``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("apt-get", "python3"):
        fail = f'[ "$1 $2" = "{failing}" ] || [ "{name}" = "{failing}" ] && exit 7'
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "ran {name} $*"\n{fail}\nexit 0\n', encoding="utf-8")
        stub.chmod(0o755)
    script = "set -euo pipefail\n" + ci_step() + '\necho "== after the step"\n'
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_the_step_passes_when_every_part_passes(tmp_path: Path) -> None:
    result = run_step(tmp_path, failing=None)
    assert result.returncode == 0, result.stderr
    assert "ran python3 -m pytest" in result.stdout
    assert "test command passed" in result.stdout and "== after the step" in result.stdout


@pytest.mark.parametrize("failing", ["apt-get", "-m pip", "-m pytest"])
def test_the_step_fails_when_any_part_fails(tmp_path: Path, failing: str) -> None:
    result = run_step(tmp_path, failing=failing)
    assert result.returncode == 7, (result.stdout, result.stderr)
    assert "test command passed" not in result.stdout and "== after the step" not in result.stdout
    assert "FAILED (exit status 7)" in result.stderr
