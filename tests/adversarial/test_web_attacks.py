"""Attacks on the web surface: cross-site API calls, roles through the API,
session cookies, logout, login floods, loopback parsing, exposure at start-up
and CSRF on every dashboard form. Flask's test client and a real waitress
server, on a real SQLite file."""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from dashboard_support import csrf_token
from jobdeck import create_app
from jobdeck.cli import refuse_exposed
from jobdeck.core.config import load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.web.dashboard.throttle import LoginThrottle
from jobdeck.web.exposure import exposure_problem
from live_server import served
from websec_support import USERS, form_token
from werkzeug.routing import AnyConverter

from tests.helpers import SchedulingProbe

ROOT = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}


def make_app(deck: Jobdeck, **extra: Any) -> Any:
    """An app on ``deck``'s database and handlers with ``extra`` config; a deck
    of its own when ``extra`` has some, since a deck builds its schedules and
    queue controls from the config it is built with."""
    if extra:
        config = dataclasses.replace(deck.config, extra={**deck.config.extra, **extra})
        deck = Jobdeck(config, deck.registry, clock=deck.clock, store=deck.store)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return app


def login(client: Any, name: str, password: str, **kwargs: Any) -> Any:
    token = form_token(client.get("/login", **kwargs).get_data(as_text=True))
    return client.post("/login", data={"username": name, "password": password, "csrf_token": token}, **kwargs)


def client_at(app: Any, address: str) -> Any:
    """A test client whose requests come from ``address``."""
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def session_cookie(client: Any) -> str:
    cookie = client.get_cookie("session")
    assert cookie is not None, "no session cookie"
    return str(cookie.value)


def _value(values: dict[str, Any], arg: str, an_id: int) -> Any:
    """The value for a route's ``arg``: a known one, else any id for an ``..._id``
    (a workflow's, a batch's: the guard refuses before the row is looked up)."""
    if arg in values:
        return values[arg]
    assert arg.endswith("_id"), f"no value for the route argument {arg!r}: add one here"
    return an_id


def state_changing_api_urls(app: Any, job_id: int, name: str) -> dict[str, str]:
    """Every POST route under /api (endpoint -> a URL for it), from the URL map."""
    adapter = app.url_map.bind("localhost")
    urls = {}
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/") and "POST" in (rule.methods or ()):
            values = {"job_id": job_id, "name": name, "key": f"effect-{name}"}
            urls[rule.endpoint] = adapter.build(rule.endpoint, {k: _value(values, k, job_id) for k in rule.arguments})
    return urls


# -- the API cannot be driven cross-site -----------------------------------------

CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"},
    {"Sec-Fetch-Site": "same-site", "Origin": "http://localhost:9999"},  # another port of this host
    {"Origin": "http://evil.example"},  # a browser without Sec-Fetch-Site
    {"Origin": "null"},  # a sandboxed iframe or a data: page
]


@pytest.mark.parametrize("headers", CROSS_SITE, ids=["sec-fetch-cross-site", "sec-fetch-same-site", "origin", "null"])
def test_every_state_changing_api_route_refuses_cross_site_calls(deck, headers):
    app = make_app(deck, schedules=[{"name": "nightly", "cron": "0 3 * * *", "type": "demo.noop"}])
    job, _ = deck.enqueue("demo.noop", {})
    client = app.test_client()
    urls = state_changing_api_urls(app, job.id, "nightly")
    assert {"api.enqueue", "api_queues.pause", "api_schedules.api_pause", "api_schedules.api_run"} <= set(urls)
    for endpoint, url in urls.items():
        body = '{"type": "demo.noop", "worker_id": "w", "error": "x"}'
        for content_type in ("text/plain", "application/json"):
            r = client.post(url, data=body, headers={**headers, "Content-Type": content_type})
            assert r.status_code == 403, (endpoint, url, r.status_code, r.get_data(as_text=True))
            assert "cross-origin request refused" in r.get_json()["error"]
    assert deck.store.get(job.id).status is State.PENDING
    assert deck.store.counts(deck.clock())["pending"] == 1
    assert not any(q["paused"] for q in client.get("/api/queues").get_json()["queues"])
    assert not client.get("/api/schedules").get_json()["schedules"][0]["paused"]


def test_same_origin_browsers_and_non_browser_clients_still_work(deck):
    client = make_app(deck).test_client()
    same_origin = {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"}
    assert client.post("/api/jobs", json={"type": "demo.noop"}, headers=same_origin).status_code == 201
    assert (
        client.post("/api/jobs", json={"type": "demo.noop"}, headers={"Origin": "http://localhost"}).status_code == 201
    )
    assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201  # curl, scripts, workers
    assert client.post("/api/queues/default/pause", json={}).get_json()["paused"] is True


def test_the_bearer_token_is_not_subject_to_the_origin_check(make_deck):
    deck = make_deck(api_token="s3cret")
    client = make_app(deck).test_client()
    cross = {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}
    assert client.post("/api/jobs", json={"type": "demo.noop"}, headers=cross).status_code == 403
    bearer = {**cross, "Authorization": "Bearer s3cret"}
    assert client.post("/api/jobs", json={"type": "demo.noop"}, headers=bearer).status_code == 201
    assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 401


# -- DNS rebinding: an open deployment answers only requests addressed to this machine ---

REBOUND = {
    "Host": "rebind.evil.example:8765",
    "Origin": "http://rebind.evil.example:8765",
    "Sec-Fetch-Site": "same-origin",
}
"""What Chromium sends from a page whose own name was rebound to 127.0.0.1: same-origin, a loopback
peer, and only the Host naming the stranger."""


def test_an_open_deployment_refuses_a_rebound_host_on_the_api_and_the_dashboard(deck):
    job, _ = deck.enqueue("demo.noop", {})
    client = make_app(deck).test_client()
    assert client.post("/api/jobs", json={"type": "demo.noop"}, headers=REBOUND).status_code == 403
    assert client.post("/api/queues/default/pause", json={}, headers=REBOUND).status_code == 403
    r = client.get(f"/api/jobs/{job.id}", headers=REBOUND)
    assert r.status_code == 403 and "allowed_hosts" in r.get_json()["error"]
    page = client.get(f"/jobs/{job.id}", headers=REBOUND)
    assert page.status_code == 403 and "addressed to this machine" in page.get_data(as_text=True)
    token = csrf_token(client)  # a real one, from a page addressed to this machine
    discard = client.post(
        f"/actions/jobs/{job.id}/discard", headers={**REBOUND, "X-CSRFToken": token, "HX-Request": "true"}
    )
    assert discard.status_code in (400, 403)  # the CSRF check or the host check, whichever runs first
    assert deck.store.get(job.id).status is State.PENDING
    assert deck.store.counts(deck.clock())["pending"] == 1
    assert not any(q["paused"] for q in client.get("/api/queues").get_json()["queues"])
    for host in ("localhost:8000", "127.0.0.1:8000", "127.0.0.2", "[::1]:8000"):
        assert client.get(f"/api/jobs/{job.id}", headers={"Host": host}).status_code == 200, host
        assert client.get(f"/jobs/{job.id}", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_names_the_deployment_s_own_names(make_deck):
    deck = make_deck(allowed_hosts=["jobs.internal"])
    client = make_app(deck).test_client()
    assert (
        client.post("/api/jobs", json={"type": "demo.noop"}, headers={"Host": "jobs.internal:8000"}).status_code == 201
    )
    assert client.get("/", headers={"Host": "JOBS.internal"}).status_code == 200
    assert client.get("/", headers={"Host": "other.internal"}).status_code == 403


def test_with_users_the_host_is_not_the_guard(deck):
    """Signed-in access is what protects a deployment with users: a rebound page has no session there."""
    app = make_app(deck, users=USERS)
    operator = app.test_client()
    public = {"Host": "jobs.example.com"}
    assert login(operator, "alice", "alice-secret", headers=public).status_code == 302
    assert operator.post("/api/jobs", json={"type": "demo.noop"}, headers=public).status_code == 201
    assert app.test_client().get("/api/jobs", headers=REBOUND).status_code == 401


# -- with users, the API honours the session's role -----------------------------------


def test_with_users_a_viewer_cannot_act_through_the_api(deck):
    app = make_app(deck, users=USERS)
    job, _ = deck.enqueue("demo.noop", {})
    anonymous = app.test_client()
    assert anonymous.get("/api/jobs").status_code == 401
    assert anonymous.post("/api/jobs", json={"type": "demo.noop"}).status_code == 401
    assert anonymous.get("/api/health").status_code == 200

    viewer = app.test_client()
    assert login(viewer, "victor", "victor-secret").status_code == 302
    assert viewer.get("/api/jobs").status_code == 200
    for endpoint, url in state_changing_api_urls(app, job.id, "default").items():
        r = viewer.post(url, json={"type": "demo.noop", "worker_id": "w"})
        assert r.status_code == 403 and "only operators can act" in r.get_json()["error"], (endpoint, r.status_code)
    assert deck.store.counts(deck.clock())["pending"] == 1
    assert not any(q["paused"] for q in viewer.get("/api/queues").get_json()["queues"])

    operator = app.test_client()
    assert login(operator, "alice", "alice-secret").status_code == 302
    assert operator.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201
    assert operator.post("/api/queues/default/pause", json={}).get_json()["paused"] is True


def test_with_users_and_a_token_scripts_use_the_token(make_deck):
    deck = make_deck(api_token="s3cret")
    client = make_app(deck, users=USERS).test_client()
    assert client.post("/api/jobs", json={"type": "demo.noop"}).status_code == 401
    r = client.post("/api/jobs", json={"type": "demo.noop"}, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 201
    assert client.post("/api/jobs", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401


# -- the session cookie ----------------------------------------------------------------


def _set_cookie(response: Any) -> str:
    [header] = [v for k, v in response.headers.items() if k.lower() == "set-cookie" and v.startswith("session=")]
    return str(header)


def test_the_session_cookie_is_samesite_lax_and_httponly_and_not_secure_by_default(deck):
    client = make_app(deck, users=USERS).test_client()
    r = login(client, "alice", "alice-secret")
    assert r.status_code == 302
    header = _set_cookie(r)
    assert "SameSite=Lax" in header and "HttpOnly" in header and "Secure" not in header
    assert "Strict-Transport-Security" not in r.headers


def test_secure_cookies_marks_the_cookie_secure_and_sends_hsts(make_deck):
    deck = make_deck(secure_cookies=True)
    client = make_app(deck, users=USERS).test_client()
    # Flask-WTF checks the Referer of an HTTPS form post (WTF_CSRF_SSL_STRICT).
    r = login(
        client, "alice", "alice-secret", base_url="https://localhost", headers={"Referer": "https://localhost/login"}
    )
    header = _set_cookie(r)
    assert "Secure" in header and "SameSite=Lax" in header and "HttpOnly" in header
    assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert client.get("/api/health").headers["Strict-Transport-Security"] == "max-age=31536000"


def test_secure_cookies_is_read_from_the_environment(make_config):
    assert load(path=None, env={"JOBDECK_SECURE_COOKIES": "true"}).secure_cookies is True
    assert make_config().secure_cookies is False


# -- logout ends the session everywhere -----------------------------------------------


@pytest.mark.backends
def test_a_copied_cookie_stops_working_after_logout_in_every_process(make_deck):
    """Two apps on one database file stand for two processes: the copy is
    used on the other one, and logout on the first ends it there too."""
    first = make_app(make_deck(), users=USERS)
    second = make_app(make_deck(), users=USERS)
    owner = first.test_client()
    assert login(owner, "alice", "alice-secret").status_code == 302
    thief = second.test_client()
    thief.set_cookie("session", session_cookie(owner))
    assert thief.get("/").status_code == 200
    assert thief.post("/api/jobs", json={"type": "demo.noop"}).status_code == 201

    token = form_token(owner.get("/").get_data(as_text=True))
    assert owner.post("/logout", data={"csrf_token": token}).status_code == 302

    r = thief.get("/")
    assert r.status_code == 302 and "/login" in r.headers["Location"]
    assert thief.post("/api/jobs", json={"type": "demo.noop"}).status_code == 401
    assert owner.get("/").status_code == 302


def test_a_session_expires_after_its_lifetime_and_is_pruned(deck, clock):
    from jobdeck.store.sessions import SESSION_LIFETIME, open_session, session_user

    client = make_app(deck, users=USERS).test_client()
    assert login(client, "alice", "alice-secret").status_code == 302
    clock.advance(SESSION_LIFETIME.total_seconds() - 1)
    assert client.get("/").status_code == 200
    clock.advance(2)
    assert client.get("/").status_code == 302
    old = open_session(deck.store, "alice", "fingerprint", clock() - SESSION_LIFETIME * 2)
    open_session(deck.store, "victor", "fingerprint", clock())  # a login prunes the expired rows
    from jobdeck.store.models import dashboard_sessions
    from sqlalchemy import func, select

    with deck.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(dashboard_sessions)).scalar_one() == 1
    assert session_user(deck.store, old, "fingerprint", clock()) is None


def test_a_cookie_from_before_server_side_sessions_is_refused(deck):
    """A signed cookie naming a user but no session row (what the previous
    release issued, or a forged-with-the-secret one) is not a session."""
    app = make_app(deck, users=USERS)
    client = app.test_client()
    with client.session_transaction() as sess:
        sess["user"] = "alice"
    assert client.get("/").status_code == 302


# -- login throttling ------------------------------------------------------------------


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def throttled(deck, monkeypatch):
    """An app with users, its throttle on a settable clock, and a count of
    password checks actually performed."""
    app = make_app(deck, users=USERS)
    clock = FakeMonotonic()
    app.extensions["jobdeck_login_throttle"] = LoginThrottle(clock=clock)
    import jobdeck.web.dashboard.auth as auth

    checks = Counter[str]()
    real = auth.check_password_hash

    def counting(pwhash: str, password: str) -> bool:
        checks["hashed"] += 1
        return real(pwhash, password)

    monkeypatch.setattr(auth, "check_password_hash", counting)
    return app, clock, checks


def test_ten_failures_on_an_account_get_429_with_retry_after_and_no_hashing(throttled):
    app, clock, checks = throttled
    for i in range(10):  # each from another address: the per-account limit holds
        client = client_at(app, f"10.0.0.{i}")
        assert login(client, "alice", f"guess-{i}").status_code == 401
    assert checks["hashed"] == 10
    client = client_at(app, "10.0.1.1")
    r = login(client, "alice", "alice-secret")  # even the right password waits
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
    assert "Too many failed sign-ins" in r.get_data(as_text=True)
    assert checks["hashed"] == 10
    assert login(client, "victor", "victor-secret").status_code == 302  # another account from that address

    clock.now += 61
    assert login(client, "alice", "alice-secret").status_code == 302


def test_ten_failures_from_an_address_get_429_for_every_account(throttled):
    app, clock, checks = throttled
    client = client_at(app, "192.0.2.7")
    for i in range(10):
        assert login(client, f"user-{i}", "guess").status_code == 401
    r = login(client, "alice", "alice-secret")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) == 60
    clock.now += 30
    assert int(login(client, "alice", "alice-secret").headers["Retry-After"]) == 30
    assert checks["hashed"] == 10
    other = client_at(app, "192.0.2.8")
    assert login(other, "alice", "alice-secret").status_code == 302


def test_two_hundred_wrong_passwords_are_not_all_answered(throttled):
    app, _clock, checks = throttled
    client = app.test_client()
    statuses = Counter(login(client, "alice", f"pw-{i}").status_code for i in range(200))
    assert statuses == {401: 10, 429: 190}
    assert checks["hashed"] == 10


def test_a_login_that_finds_the_hashing_slot_busy_is_refused_at_once(throttled):
    app, _clock, checks = throttled
    client = app.test_client()
    with app.extensions["jobdeck_login_throttle"].hashing() as slot:
        assert slot
        r = login(client, "alice", "alice-secret")
    assert r.status_code == 429 and r.headers["Retry-After"] == "1" and checks["hashed"] == 0
    assert login(client, "alice", "alice-secret").status_code == 302


def test_the_throttle_limits_are_configurable_and_validated(deck, make_config, registry):
    from jobdeck.core.config import ConfigError

    app = make_app(deck, users=USERS, dashboard={"login_failures": 3, "login_window_seconds": 5})
    throttle = app.extensions["jobdeck_login_throttle"]
    assert (throttle.limit, throttle.window) == (3, 5.0)
    client = app.test_client()
    assert [login(client, "alice", "nope").status_code for _ in range(4)] == [401, 401, 401, 429]
    for bad, message in [({"login_failures": 0}, "login_failures"), ({"login_failures": 2.5}, "whole number"),
                         ({"login_window_seconds": "60"}, "login_window_seconds")]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            create_app(deck=Jobdeck(make_config(users=USERS, dashboard=bad), registry))


def test_the_throttle_tables_stay_bounded():
    t = LoginThrottle(limit=3, window=60, max_keys=50, clock=FakeMonotonic())
    for i in range(1000):
        t.failed(t.keys(f"name-{i}", f"10.{i // 250}.{i % 250}.1"))
    assert len(t._failures) <= 50


HEALTH_BOUND = 1.0
"""Seconds /api/health may take during a login flood on a machine that starves no process."""
HEALTH_WAITS = 4
"""Scheduling waits a health probe goes through (the server's accept, the
thread it is handed to, the client's read, the GIL of the test's process),
each allowed as long as the longest wait a sleeping thread saw
(``SchedulingProbe``): in a probe process (the machine) or in the test's own
process (the CPU and the GIL its sixteen clients and four server threads share).
Neither grows when every server thread is busy hashing, the starvation this
test is after: a password hash releases the GIL, and a request waiting for a
free server thread keeps no thread from running. Seen on a slow machine: 1.64
s beside a CPU hog; 2.31 s in a quiet full run, with the machine's delay at
23 ms."""


@pytest.mark.parametrize("limit", [10, 10**9], ids=["throttled", "hashing-bound-only"])
def test_a_login_flood_does_not_starve_the_api(deck, limit):
    """Sixteen clients hammer /login with wrong passwords on a real server
    with four threads while /api/health is timed. With the default limit the
    flood is refused before hashing; with the limit out of the way, the bound
    on concurrent hashing alone must keep the API answering."""
    app = make_app(deck, users=USERS)
    app.config["TESTING"] = False
    app.extensions["jobdeck_login_throttle"] = LoginThrottle(limit=limit)
    stop = threading.Event()
    answered = Counter[int]()
    lock = threading.Lock()
    idle: list[float] = []
    under_flood: list[float] = []
    with served(app) as base:

        def health() -> float:
            t0 = time.monotonic()
            r = requests.get(f"{base}/api/health", timeout=10)
            assert r.status_code == 200
            return time.monotonic() - t0

        idle.extend(health() for _ in range(5))

        flooding = threading.Semaphore(0)

        def flood(n: int) -> None:
            with requests.Session() as s:
                token = form_token(s.get(f"{base}/login", timeout=10).text)
                flooding.release()
                for i in itertools.count():
                    if stop.is_set():
                        return
                    data = {"username": "alice", "password": f"no-{n}-{i}", "csrf_token": token}
                    r = s.post(f"{base}/login", data=data, timeout=30)
                    with lock:
                        answered[r.status_code] += 1

        threads = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(16)]
        for t in threads:
            t.start()
        try:
            # Timed once every client posts: the sixteen login pages they
            # load first are no flood of logins (on a slow machine the first
            # health probe waited 1.2 s behind them).
            for _ in threads:
                assert flooding.acquire(timeout=30), "a flooding client never got its login form"
            with SchedulingProbe() as probe:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    under_flood.append(health())
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
    bound = HEALTH_BOUND + HEALTH_WAITS * max(probe.machine, probe.here)
    print(f"\nlimit={limit}: health idle median {statistics.median(idle) * 1000:.1f} ms, under flood median "
          f"{statistics.median(under_flood) * 1000:.1f} ms max {max(under_flood) * 1000:.1f} ms "
          f"({len(under_flood)} probes; bound {bound:.2f} s, the machine's worst scheduling delay "
          f"{probe.machine * 1000:.0f} ms, in this process {probe.here * 1000:.0f} ms); "
          f"logins answered {dict(answered)}")  # fmt: skip
    assert sum(answered.values()) >= 50, answered
    assert answered[429] > 0 and set(answered) <= {401, 429}, answered
    if limit == 10:  # one account, one address: at most ten passwords checked, however concurrent
        assert answered[401] <= 10, answered
    assert max(under_flood) < bound, f"/api/health took {max(under_flood):.2f} s during the flood (bound {bound:.2f} s)"


# -- loopback and exposure ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [("127.0.0.1:8000", True), ("127.8.9.10:8000", True), ("[::1]:8000", True), ("localhost:8000", True),
     ("LOCALHOST:8000", True), ("127.evil.example:8000", False), ("127.0.0.1.nip.io:8000", False),
     ("localhost.evil.example:8000", False), ("0.0.0.0:8000", False), ("[::]:8000", False),
     ("10.0.0.1:8000", False), ("128.0.0.1:8000", False)],
)  # fmt: skip
def test_loopback_is_an_address_not_a_prefix(make_config, bind, loopback):
    config = make_config(bind=bind)
    assert config.is_loopback is loopback
    assert (exposure_problem(config) is None) is loopback
    if not loopback:
        import click

        with pytest.raises(click.ClickException, match="not loopback"):
            refuse_exposed(config)


def test_an_open_deployment_answers_only_this_machine(deck, make_deck):
    """However the server was bound (gunicorn ignores ``bind``), an open
    dashboard and an open API refuse a client from another machine."""
    app = make_app(deck)
    remote = client_at(app, "10.1.2.3")
    page = remote.get("/")
    assert page.status_code == 403 and "answers only this machine" in page.get_data(as_text=True)
    assert remote.get("/api/jobs").status_code == 403
    r = remote.post("/api/jobs", json={"type": "demo.noop"})
    assert r.status_code == 403 and "no api_token and no users" in r.get_json()["error"]
    assert deck.store.counts(deck.clock())["pending"] == 0
    for address in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"):
        assert client_at(app, address).get("/").status_code == 200, address
    tokened = client_at(make_app(make_deck(api_token="s3cret"), users=USERS), "10.1.2.3")
    assert (
        tokened.post("/api/jobs", json={"type": "demo.noop"}, headers={"Authorization": "Bearer s3cret"}).status_code
        == 201
    )
    assert tokened.get("/").status_code == 302  # to the login form


def _run_wsgi(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PYTHONPATH": str(ROOT), "JOBDECK_INSTANCE_PATH": str(tmp_path), "PATH": os.environ["PATH"],
                   "JOBDECK_WORKERS": "0", **env}  # fmt: skip
    code = "import wsgi; wsgi.runtime.stop(); print('started')"
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_wsgi_refuses_to_start_exposed_like_serve(tmp_path):
    no_token = _run_wsgi(tmp_path, JOBDECK_BIND="127.evil.example:8000")
    assert no_token.returncode != 0 and "no api_token configured" in no_token.stderr, no_token.stderr
    no_users = _run_wsgi(tmp_path, JOBDECK_BIND="0.0.0.0:8000", JOBDECK_API_TOKEN="t")
    assert no_users.returncode != 0 and "no users configured" in no_users.stderr, no_users.stderr
    loopback = _run_wsgi(tmp_path, JOBDECK_BIND="127.0.0.1:8000")
    assert loopback.returncode == 0 and "started" in loopback.stdout, loopback.stderr


# -- CSRF on every dashboard form --------------------------------------------------------------


def _dashboard_post_urls(app: Any, job_id: int) -> list[str]:
    """Every POST route outside /api, each value of an ``any(...)`` part included."""
    adapter = app.url_map.bind("localhost")
    urls = []
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/") or "POST" not in (rule.methods or ()):
            continue
        choices: dict[str, list[Any]] = {}
        for arg in sorted(rule.arguments):
            converter = rule._converters[arg]
            if isinstance(converter, AnyConverter):
                choices[arg] = list(converter.items)
            else:
                name = "nightly" if rule.rule.startswith("/schedules/") else "default"
                choices[arg] = [_value({"job_id": job_id, "name": name, "action": "retry"}, arg, job_id)]
        for combo in itertools.product(*choices.values()):
            urls.append(adapter.build(rule.endpoint, dict(zip(choices, combo, strict=True))))
    return urls


def test_every_dashboard_post_route_refuses_a_request_without_csrf_token(deck):
    from dashboard_support import make_dead

    app = make_app(deck, users=USERS, schedules=[{"name": "nightly", "cron": "0 3 * * *", "type": "demo.noop"}])
    job_id = make_dead(deck)
    client = app.test_client()
    assert login(client, "alice", "alice-secret").status_code == 302
    urls = _dashboard_post_urls(app, job_id)
    assert {"/login", "/logout", f"/actions/jobs/{job_id}/retry", "/queues/default/pause",
            "/schedules/nightly/run"} <= set(urls), urls  # fmt: skip
    for url in urls:
        for headers in ({}, {"HX-Request": "true"}, {"X-CSRFToken": "forged"}):
            r = client.post(url, data={"tab": "dead", "ids": [job_id], "payload": "{}", "username": "alice",
                                       "password": "alice-secret", "csrf_token": "forged" if headers else ""},
                            headers=headers)  # fmt: skip
            assert r.status_code == 400, (url, headers, r.status_code)
            assert "did not come from this dashboard" in r.get_data(as_text=True)
    assert deck.store.get(job_id).status is State.DEAD
    assert client.get("/").status_code == 200  # still signed in: the logout was refused too
    token = form_token(client.get("/").get_data(as_text=True))
    r = client.post(f"/actions/jobs/{job_id}/retry", headers={"X-CSRFToken": token, "HX-Request": "true"})
    assert r.status_code == 200 and deck.store.get(job_id).status is State.PENDING
