"""Where the docs are, as a user meets it: ``jobdeck serve`` prints it at
start, and every dashboard page's footer links there. Nothing points outside
the machine: the deployment may be offline (``app/docs.py``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from jobdeck.docs import DOCS_PORT, DOCS_URL, checkout_docs, where

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_serve_prints_where_the_docs_are(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    command = [sys.executable, "-m", "jobdeck.cli", "serve", "--server", "waitress", "--workers", "0"]
    proc = subprocess.Popen(
        [*command, "--bind", f"127.0.0.1:{port}"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: _answers(port) or proc.poll() is not None, timeout=60, message="jobdeck serve to answer")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    lines = err.splitlines()
    assert any(line.startswith("Jobdeck serving on") for line in lines), err
    docs_line = next((line for line in lines if line.startswith("Docs:")), "no Docs: line")
    assert str(REPO / "docs") in docs_line
    assert f"mkdocs serve -a 127.0.0.1:{DOCS_PORT}" in docs_line and DOCS_URL in docs_line


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_a_wheel_without_docs_says_where_they_are(tmp_path: Path) -> None:
    """An installed wheel has no docs/ beside app/: the line names the source instead."""
    assert checkout_docs(tmp_path) is None
    assert where(tmp_path).startswith("Docs: the docs/ folder of Jobdeck's source")
    assert checkout_docs(REPO) == REPO / "docs"


def test_every_page_footer_links_to_the_docs(client) -> None:
    for path in ("/", "/jobs/dead", "/schedules", "/workers"):
        html = client.get(path).get_data(as_text=True)
        assert f'<a href="{DOCS_URL}">' in html, path
        assert f"mkdocs serve -a 127.0.0.1:{DOCS_PORT}" in html, path
