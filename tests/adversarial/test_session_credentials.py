"""A changed password or role in the config ends the user's sessions.

A real ``jobdeck serve`` is signed in to, stopped, and started again on the
same database with the user's password (then role) changed in its config:
the cookie from before is refused, the dashboard sends it to the login form,
the API answers 401, and a new sign-in works. Restarting with the config
unchanged keeps the session: it is the change that ends it, not the restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.adversarial.websec_support import form_token
from tests.helpers import password_hash

pytestmark = pytest.mark.slow

OLD = password_hash("alice-old-secret")
NEW = password_hash("alice-new-secret")


class Server:
    """Start and restart one ``jobdeck serve`` on one port and database,
    with the ``[users.alice]`` table given each time."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.proc: JobdeckProcess | None = None
        self.port: int | None = None
        self.starts = 0

    def start(self, password_hash: str, role: str) -> str:
        config = write_config(self.tmp_path, workers=0)
        with config.open("a") as f:
            f.write(f"\n[users.alice]\npassword_hash = {json.dumps(password_hash)}\nrole = {json.dumps(role)}\n")
        self.starts += 1
        self.proc = JobdeckProcess(self.tmp_path, config, name=f"serve{self.starts}", port=self.port)
        self.port = self.proc.port
        self.proc.wait_serving()
        return self.proc.url

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.stop()


def sign_in(url: str, password: str) -> requests.Session:
    browser = requests.Session()
    token = form_token(browser.get(f"{url}/login", timeout=10).text)
    r = browser.post(
        f"{url}/login", data={"username": "alice", "password": password, "csrf_token": token},
        allow_redirects=False, timeout=10,
    )  # fmt: skip
    assert r.status_code == 302 and "/login" not in r.headers["Location"], r.text[:300]
    return browser


def signed_in(browser: requests.Session, url: str) -> bool:
    """Whether the dashboard and the API take this browser's cookie."""
    page = browser.get(f"{url}/jobs/dead", allow_redirects=False, timeout=10)
    api = browser.get(f"{url}/api/jobs", timeout=10)
    if page.status_code == 200:
        assert api.status_code == 200, api.text[:200]
        return True
    assert page.status_code == 302 and "/login" in page.headers["Location"], page.status_code
    assert api.status_code == 401, api.status_code
    return False


def test_a_restart_with_the_same_config_keeps_the_session(server: Server) -> None:
    url = server.start(OLD, "operator")
    browser = sign_in(url, "alice-old-secret")
    assert signed_in(browser, url)
    server.stop()
    url = server.start(OLD, "operator")
    assert signed_in(browser, url), "a plain restart ended the session"


def test_a_new_password_in_the_config_ends_the_old_session(server: Server) -> None:
    url = server.start(OLD, "operator")
    browser = sign_in(url, "alice-old-secret")
    assert signed_in(browser, url)
    server.stop()
    url = server.start(NEW, "operator")
    assert not signed_in(browser, url), "the session opened with the old password outlived its change"
    again = sign_in(url, "alice-new-secret")
    assert signed_in(again, url)
    assert not signed_in(browser, url)


def test_a_new_role_in_the_config_ends_the_old_session(server: Server) -> None:
    url = server.start(OLD, "operator")
    browser = sign_in(url, "alice-old-secret")
    assert ">Retry all matching" in browser.get(f"{url}/jobs/dead", timeout=10).text
    server.stop()
    url = server.start(OLD, "viewer")
    assert not signed_in(browser, url), "the operator's session outlived the change of role to viewer"
    viewer = sign_in(url, "alice-old-secret")
    page = viewer.get(f"{url}/jobs/dead", timeout=10).text
    assert "viewer" in page and "Retry all matching" not in page
