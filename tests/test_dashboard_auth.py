"""Login, roles, and the refusal to serve an open dashboard beyond loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from dashboard_support import csrf_token, make_dash_app, make_dead, post
from jobdeck.cli import main, refuse_exposed
from jobdeck.core.states import State

from tests.helpers import password_hash

ROOT = Path(__file__).resolve().parents[1]
USERS = {
    "alice": {"password_hash": password_hash("alice-secret"), "role": "operator"},
    "victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"},
}


@pytest.fixture
def guarded(deck):
    return make_dash_app(deck, users=USERS).test_client()


def login(client, name, password):
    token = _login_token(client)
    return client.post("/login", data={"username": name, "password": password, "csrf_token": token})


def _login_token(client):
    import re

    html = client.get("/login").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def test_pages_need_a_login_when_users_are_configured(guarded):
    r = guarded.get("/jobs/dead")
    assert r.status_code == 302 and "/login?next=" in r.headers["Location"]
    htmx = guarded.get("/fragments/overview", headers={"HX-Request": "true"})
    assert htmx.status_code == 401 and htmx.headers["HX-Redirect"].startswith("/login")
    with guarded.get("/static/css/dashboard.css") as css:
        assert css.status_code == 200
    assert guarded.get("/api/health").status_code == 200


def test_wrong_password_and_unknown_user_are_refused_alike(guarded):
    for name, pw in [("alice", "nope"), ("mallory", "alice-secret")]:
        r = login(guarded, name, pw)
        assert r.status_code == 401 and "Unknown user or wrong password." in r.get_data(as_text=True)
    assert guarded.get("/").status_code == 302


def test_operator_logs_in_acts_and_is_named_in_the_audit(guarded, deck):
    r = login(guarded, "alice", "alice-secret")
    assert r.status_code == 302 and r.headers["Location"] == "/"
    job_id = make_dead(deck)
    html = guarded.get("/jobs/dead").get_data(as_text=True)
    assert "alice" in html and ">Retry</button>" in html
    assert post(guarded, f"/actions/jobs/{job_id}/retry").status_code == 200
    assert "alice" in guarded.get("/audit").get_data(as_text=True)


def test_login_redirects_only_to_local_paths(guarded):
    token = _login_token(guarded)
    r = guarded.post("/login?next=https://evil.example/", data={"username": "alice", "password": "alice-secret",
                                                               "csrf_token": token})  # fmt: skip
    assert r.headers["Location"] == "/"


def test_viewer_sees_no_buttons_and_is_refused_with_403(guarded, deck):
    login(guarded, "victor", "victor-secret")
    job_id = make_dead(deck)
    html = guarded.get("/jobs/dead").get_data(as_text=True)
    assert "viewer" in html and ">Retry</button>" not in html and "Retry all matching" not in html
    assert "Edit payload and retry" not in guarded.get(f"/jobs/{job_id}").get_data(as_text=True)
    for url, data in [(f"/actions/jobs/{job_id}/retry", {}), (f"/actions/jobs/{job_id}/edit", {"payload": "{}"}),
                      ("/actions/selected/retry", {"tab": "dead", "ids": [job_id]}),
                      ("/actions/matching/discard", {"tab": "dead", "up_to": job_id})]:  # fmt: skip
        r = post(guarded, url, data)
        assert r.status_code == 403 and "only operators can act" in r.get_data(as_text=True)
    assert deck.store.get(job_id).status is State.DEAD


def test_logout_ends_the_session(guarded):
    login(guarded, "alice", "alice-secret")
    r = guarded.post("/logout", data={"csrf_token": csrf_token(guarded)})
    assert r.status_code == 302
    assert guarded.get("/").status_code == 302


def test_a_removed_user_loses_access(deck):
    client = make_dash_app(deck, users=dict(USERS)).test_client()
    login(client, "alice", "alice-secret")
    del deck.config.extra["users"]["alice"]
    client.application.extensions["jobdeck_dashboard"].users.pop("alice")
    assert client.get("/").status_code == 302


def test_open_access_says_so(dash_open):
    assert "open access · operator" in dash_open.get("/").get_data(as_text=True)
    assert dash_open.get("/login").status_code == 302


@pytest.fixture
def dash_open(deck):
    return make_dash_app(deck).test_client()


def test_users_config_is_validated(make_config, registry):
    from jobdeck import create_app
    from jobdeck.core.config import ConfigError
    from jobdeck.deck import Jobdeck

    for users, message in [({"bob": {"role": "operator"}}, "users.bob.password_hash"),
                           ({"bob": {"password_hash": "x$y", "role": "admin"}}, "users.bob.role"),
                           ({"bob": "pw"}, "users.bob")]:  # fmt: skip
        deck = Jobdeck(make_config(users=users), registry)
        try:
            with pytest.raises(ConfigError, match=message):
                create_app(deck=deck)
        finally:
            deck.store.engine.dispose()


def test_refuses_non_loopback_bind_without_users(make_config):
    import click

    exposed = make_config(bind="0.0.0.0:8000", api_token="t")
    with pytest.raises(click.ClickException, match="no users configured"):
        refuse_exposed(exposed)
    refuse_exposed(make_config(bind="0.0.0.0:8000", api_token="t", users=USERS))
    refuse_exposed(make_config(bind="127.0.0.1:8000"))


def test_serve_refuses_in_a_real_process(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "JOBDECK_BIND": "0.0.0.0:18999", "JOBDECK_API_TOKEN": "t",
           "JOBDECK_INSTANCE_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "jobdeck.cli", "serve"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode != 0 and "no users configured" in r.stderr


def test_hash_password_command_makes_a_usable_hash():
    from werkzeug.security import check_password_hash

    result = CliRunner().invoke(main, ["hash-password"], input="long enough pw\nlong enough pw\n")
    assert result.exit_code == 0, result.output
    hashed = [line for line in result.output.splitlines() if "$" in line][-1].strip()
    assert check_password_hash(hashed, "long enough pw")
    short = CliRunner().invoke(main, ["hash-password", "--password-stdin"], input="short\n")
    assert short.exit_code != 0 and "at least 8" in short.output
