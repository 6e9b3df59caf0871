"""The docs site builds with ``mkdocs build --strict``: a broken link, a
missing anchor, a nav entry without its page or a page left out of the nav
fails the suite. The build goes to a temporary folder (it takes well under
a second), never into the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # other processes and builds: left out of the quick tier

REPO = Path(__file__).resolve().parents[1]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``, as the docs extra installs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor; not a warning of ours
    command = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(config),
        "--site-dir",
        str(site),
    ]
    return subprocess.run(command, cwd=config.parent, env=env, capture_output=True, text=True, timeout=120)


def test_docs_build_strict(tmp_path: Path) -> None:
    out = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout}{out.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "screenshots" / "overview.png").is_file(), "the screenshots are not in the site"


def _copy(tmp_path: Path) -> Path:
    """The docs and their config copied (screenshots as files), to break on purpose."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "mkdocs.yml"


def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    config = _copy(tmp_path)
    with (tmp_path / "docs" / "index.md").open("a") as fh:
        fh.write("\nSee [the page that is not there](no-such-page.md).\n")
    out = build(config, tmp_path / "site")
    assert out.returncode != 0, out.stdout + out.stderr
    assert "no-such-page.md" in out.stdout + out.stderr


def test_strict_build_fails_on_a_page_missing_from_the_nav(tmp_path: Path) -> None:
    config = _copy(tmp_path)
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    out = build(config, tmp_path / "site")
    assert out.returncode != 0, out.stdout + out.stderr
    assert "orphan.md" in out.stdout + out.stderr


def test_strict_build_fails_on_a_nav_entry_without_its_page(tmp_path: Path) -> None:
    config = _copy(tmp_path)
    text = config.read_text()
    config.write_text(text.replace("  - Home: index.md\n", "  - Home: index.md\n  - Gone: gone.md\n", 1))
    out = build(config, tmp_path / "site")
    assert out.returncode != 0, out.stdout + out.stderr
    assert "gone.md" in out.stdout + out.stderr
