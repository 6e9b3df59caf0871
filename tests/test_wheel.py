"""The wheel is the product: built from this checkout, installed into a fresh
virtualenv outside it, ``jobdeck serve --demo`` started from an empty folder
serves the dashboard with its CSS and htmx. Only an editable checkout used to
run, because templates/ and static/ sit at the top of the repository and were
not packaged; this test fails (never skips) when anything is left out again.

pip builds and installs with its cache, so a warm machine needs no network
beyond what ``pip install -e '.[test]'`` already fetched."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PIP = ("--disable-pip-version-check", "--no-input", "--quiet", "--prefer-binary")
# What a source tree copy leaves behind: local environments, caches, build output and run data.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "venv", "__pycache__", "*.egg-info", "build", "dist", "instance", "results",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules",
)  # fmt: skip


def _clean_env() -> dict[str, str]:
    """The environment without anything that points back at the checkout or configures Jobdeck."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"):
        env.pop(name, None)
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float) -> str:
    out = subprocess.run(args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, args))} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel`` builds from a copy of this tree (setuptools
    writes build/ and egg-info beside the sources; the checkout stays as it is)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", *PIP, "--no-deps", "-w", dist, source], cwd=tmp, timeout=300)
    wheels = list(dist.glob("jobdeck-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _expected_files() -> set[str]:
    """Every file the installed product needs, under its name in the wheel."""
    expected = {f"jobdeck/{p.relative_to(REPO / 'app').as_posix()}" for p in (REPO / "app").rglob("*.py")}
    expected |= {"jobdeck/demo.toml", "jobdeck/store/migrations/script.py.mako"}
    for top in ("templates", "static"):
        for p in (REPO / top).rglob("*"):
            relative = p.relative_to(REPO / top)
            if p.is_file() and relative.parts[0] != "screenshots":  # the README's pictures, not the product's
                expected.add(f"jobdeck/{top}/{relative.as_posix()}")
    return {name for name in expected if "__pycache__" not in name}


def test_wheel_carries_code_templates_static_migrations_and_demo_config(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_files() - names)
    assert not missing, f"missing from {wheel.name} (pyproject.toml [tool.setuptools] packages/package-data): {missing}"
    assert "jobdeck/static/vendor/htmx-2.0.11.min.js" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def _answers(port: int) -> bool:
    try:
        return _get(port, "/api/health")[0] == 200
    except OSError:
        return False


@pytest.fixture
def installed(wheel: Path, tmp_path: Path) -> Path:
    """A fresh virtualenv (no system site-packages) holding the wheel and its
    dependencies, installed by this environment's pip (``--python``): a pip
    of its own in the virtualenv cost an ensurepip for nothing the wheel
    carries. ``--no-compile``: byte-compiling every installed package up
    front compiled far more than ``jobdeck serve`` imports (Python compiles
    a module as it imports it when no bytecode is there)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, clear=True)
    python = env_dir / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", *PIP, "--no-compile", wheel],
        cwd=tmp_path,
        timeout=300,
    )
    return env_dir


@pytest.fixture
def served(installed: Path, tmp_path: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _run([installed / "bin" / "python", "-c", "import jobdeck; print(jobdeck.__file__)"], cwd=empty, timeout=30)
    assert Path(where.strip()).is_relative_to(installed), f"imported from outside the virtualenv: {where}"
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [installed / "bin" / "jobdeck", "serve", "--demo", "--bind", f"127.0.0.1:{port}"],
            cwd=empty, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: _answers(port) or proc.poll() is not None, 60, 0.05, "jobdeck serve to answer")
            assert proc.poll() is None, f"jobdeck serve exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            yield port, empty, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_installed_wheel_serves_dashboard_from_an_empty_folder(
    served: tuple[int, Path, subprocess.Popen[bytes]],
) -> None:
    port, folder, proc = served
    status, kind, body = _get(port, "/")
    assert status == 200, body[:2000]
    assert kind.startswith("text/html")
    page = body.decode()
    assets = re.findall(r'(?:href|src)="(/static/[^"]+)"', page)
    css = [a for a in assets if a.endswith(".css")]
    htmx = [a for a in assets if re.search(r"/htmx[^/]*\.js$", a)]
    assert css and htmx, f"the page links no CSS or no htmx: {assets}"
    for path in assets:
        status, kind, content = _get(port, path)
        assert status == 200, f"{path}: {status}"
        assert content, f"{path} is empty"
    assert _get(port, css[0])[1].startswith("text/css")
    assert b"htmx" in _get(port, htmx[0])[2]
    assert (folder / "instance" / "jobdeck.db").is_file(), "the default instance path is the working folder's"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
