"""The tree stays formatted and lint-clean: ``ruff format --check`` and
``ruff check`` run over the whole repository (app, tests, bench), so CI fails
on unformatted code instead of a later diff carrying formatting noise."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_tree_is_formatted() -> None:
    out = _run("format", "--check", ".")
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout}{out.stderr}"


def test_tree_is_lint_clean() -> None:
    out = _run("check", ".")
    assert out.returncode == 0, f"ruff check:\n{out.stdout}{out.stderr}"


def test_format_check_catches_unformatted_code(tmp_path: Path) -> None:
    """The check is live: the same configuration rejects a badly formatted file."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "bad.py").write_text("x = {  'a':1 }\n")
    out = _run("format", "--check", ".", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "bad.py" in out.stdout + out.stderr
