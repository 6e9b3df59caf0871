"""Jobdeck mounted inside a host Flask app (``Jobdeck.init_app``): the host
keeps its routes and login, the host's role decides what a person may do,
and the dashboard, its static files, CSRF and the API all work under
``/ops/jobs``. Also the producer that only enqueues, and ``start``/``stop``.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import pytest
from dashboard_support import make_dead
from embed_host import PREFIX, csrf_of, log_in, make_host
from flask import Flask
from jobdeck import Jobdeck
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.docs import DOCS_URL
from jobdeck.store.audit import list_audit

from tests.conftest import wait_for

pytestmark = pytest.mark.backends

HTMX = {"HX-Request": "true"}


@pytest.fixture
def host(deck):
    app = make_host(deck)
    app.config["TESTING"] = True
    return app


@pytest.fixture
def client(host):
    return host.test_client()


def test_the_hosts_own_routes_and_login_still_work(client):
    r = client.get("/")
    assert r.status_code == 200 and b"Welcome guest" in r.data
    assert r.headers["X-Served-By"] == "host"
    assert client.get("/private").status_code == 401
    log_in(client, "bob")
    assert client.get("/private").data == b"private page of bob"
    assert client.get("/nope").status_code == 404
    assert client.get("/nope").headers["X-Served-By"] == "host"
    assert client.get_cookie("session", path="/") is not None  # the host's cookie keeps its name


def test_signed_out_goes_to_the_hosts_login_and_comes_back(client):
    r = client.get(f"{PREFIX}/jobs/dead?q=x")
    assert r.status_code == 302
    assert r.headers["Location"] == "/login?next=%2Fops%2Fjobs%2Fjobs%2Fdead%3Fq%3Dx"
    assert "X-Served-By" not in r.headers  # Jobdeck answered, not the host
    page = {"HX-Current-URL": f"http://localhost{PREFIX}/jobs/dead?q=x"}
    r = client.get(f"{PREFIX}/fragments/overview", headers={**HTMX, **page})
    assert r.status_code == 401  # back to the page the fragment polled for, not the fragment
    assert r.headers["HX-Redirect"] == "/login?next=%2Fops%2Fjobs%2Fjobs%2Fdead%3Fq%3Dx"
    elsewhere = {"HX-Current-URL": "http://evil.example/ops/jobs/x"}
    r = client.get(f"{PREFIX}/fragments/overview", headers={**HTMX, **elsewhere})
    assert r.headers["HX-Redirect"] == "/login?next=%2Fops%2Fjobs%2F"
    r = client.post("/login", data={"username": "bob", "password": "bob-pw", "next": f"{PREFIX}/jobs/dead"})
    assert r.headers["Location"] == f"{PREFIX}/jobs/dead"
    assert client.get(f"{PREFIX}/jobs/dead").status_code == 200


def test_without_login_url_no_role_is_forbidden(deck):
    client = make_host(deck, login_url=None).test_client()
    r = client.get(f"{PREFIX}/")
    assert r.status_code == 403 and b"may not see Jobdeck" in r.data
    log_in(client, "eve")  # signed in to the host, but no Jobdeck role
    assert client.get(f"{PREFIX}/").status_code == 403
    log_in(client, "bob")
    assert client.get(f"{PREFIX}/").status_code == 200


def test_a_host_user_without_a_role_is_refused_everywhere(client):
    log_in(client, "eve")
    assert client.get(f"{PREFIX}/").status_code == 302
    r = client.get(f"{PREFIX}/api/jobs")
    assert r.status_code == 401 and "error" in r.get_json()
    assert client.post(f"{PREFIX}/api/jobs", json={"type": "demo.noop"}).status_code == 401


def test_current_role_runs_in_the_hosts_request_context(client, host):
    log_in(client, "bob")
    client.get(f"{PREFIX}/jobs/pending")
    calls = host.extensions["role_calls"]
    assert calls and calls[-1] == {"app": "host_app", "path": f"{PREFIX}/jobs/pending", "user": "bob"}


URL_ATTRS = re.compile(r'(?:href|src|action|hx-get|hx-post|hx-put|hx-patch|hx-delete)=["\']([^"\'#][^"\']*)["\']')


def test_every_url_on_every_page_carries_the_prefix(client, deck):
    job_id = make_dead(deck)
    log_in(client, "ada")
    pages = ["/", "/jobs/pending", "/jobs/dead", f"/jobs/{job_id}", "/errors/dead", "/schedules", "/queues",
             "/workers", "/audit", f"/fragments/jobs/{job_id}", "/fragments/overview"]  # fmt: skip
    for path in pages:
        r = client.get(PREFIX + path, headers=HTMX if "/fragments/" in path else {})
        assert r.status_code == 200, path
        # The footer's link to the docs is the one URL that is not Jobdeck's (app/docs.py).
        urls = [u for u in URL_ATTRS.findall(r.get_data(as_text=True)) if u != DOCS_URL]
        assert urls, path
        assert all(u.startswith(f"{PREFIX}/") for u in urls), (path, [u for u in urls if not u.startswith(PREFIX)])
    assert client.get(PREFIX).status_code == 200  # the bare prefix is the overview too


ROOT = Path(__file__).resolve().parents[1]
ABSOLUTE = re.compile(
    r'(?:href|src|action|hx-[a-z]+)=["\']/|url\(\s*["\']?/|["\'`]/(?:api|static|actions|fragments|jobs)\b'
)


def test_no_template_script_or_stylesheet_writes_an_absolute_path():
    """Every URL comes from ``url_for`` (or is relative), so a page mounted
    under a prefix links inside it: a new template that writes ``href="/..."``
    breaks embedding, and this says where."""
    files = [*ROOT.glob("templates/*.html"), *ROOT.glob("static/js/*.js"), *ROOT.glob("static/css/*.css")]
    assert len(files) > 20
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for m in ABSOLUTE.finditer(f.read_text())]
    assert found == []


def test_viewer_may_look_but_not_act(client, deck):
    job_id = make_dead(deck)
    log_in(client, "bob")
    page = client.get(f"{PREFIX}/jobs/{job_id}")
    assert page.status_code == 200
    assert b"bob" in page.data and b"viewer" in page.data
    assert b"Sign out" not in page.data  # signing out is the host's business
    token = csrf_of(page.get_data(as_text=True))
    r = client.post(f"{PREFIX}/actions/jobs/{job_id}/discard", headers={**HTMX, "X-CSRFToken": token})
    assert r.status_code == 403 and b"only operators can act" in r.data
    assert client.get(f"{PREFIX}/api/jobs/{job_id}").status_code == 200
    r = client.post(f"{PREFIX}/api/jobs/{job_id}/discard")
    assert r.status_code == 403 and "viewer" in r.get_json()["error"]
    assert deck.store.get(job_id).status is State.DEAD


def test_operator_acts_through_htmx_with_csrf_and_is_audited_by_host_name(client, deck):
    job_id = make_dead(deck)
    log_in(client, "ada")
    token = csrf_of(client.get(f"{PREFIX}/jobs/dead").get_data(as_text=True))
    refused = client.post(f"{PREFIX}/actions/jobs/{job_id}/discard", headers=HTMX)
    assert refused.status_code == 400 and b"did not come from this dashboard" in refused.data
    assert deck.store.get(job_id).status is State.DEAD
    r = client.post(f"{PREFIX}/actions/jobs/{job_id}/discard", headers={**HTMX, "X-CSRFToken": token})
    assert r.status_code == 200 and f"Job {job_id} discarded".encode() in r.data
    assert deck.store.get(job_id).status is State.DISCARDED
    entries, _ = list_audit(deck.store)
    assert entries[0].actor == "ada" and entries[0].action == "discard"


def test_jobdecks_session_cookie_is_its_own_and_scoped_to_the_prefix(client):
    log_in(client, "ada")
    client.get(f"{PREFIX}/")
    cookie = client.get_cookie("jobdeck_session", path=PREFIX)
    assert cookie is not None and cookie.path == PREFIX
    assert client.get_cookie("jobdeck_session", path="/") is None
    assert client.get_cookie("session", path="/") is not None


def test_static_files_and_the_csp_under_the_prefix(client):
    for path, kind in [("css/dashboard.css", "text/css"), ("js/dashboard.js", "javascript"),
                       ("vendor/htmx-2.0.11.min.js", "javascript")]:  # fmt: skip
        r = client.get(f"{PREFIX}/static/{path}")
        r.close()
        assert r.status_code == 200 and kind in r.content_type, path
    assert client.get("/static/css/dashboard.css").status_code == 404  # the host's root is not Jobdeck's
    log_in(client, "ada")
    csp = client.get(f"{PREFIX}/").headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_the_api_under_the_prefix_with_the_hosts_role(client, deck):
    assert client.get(f"{PREFIX}/api/health").status_code == 200
    doc = client.get(f"{PREFIX}/api/openapi.json").get_json()
    assert doc["servers"] == [{"url": PREFIX}] and "/api/jobs" in doc["paths"]
    assert client.get(f"{PREFIX}/api/jobs").status_code == 401
    log_in(client, "ada")
    r = client.post(f"{PREFIX}/api/jobs", json={"type": "demo.noop", "payload": {"n": 1}})
    assert r.status_code == 201, r.get_json()
    listed = client.get(f"{PREFIX}/api/jobs").get_json()["jobs"]
    assert [j["id"] for j in listed] == [r.get_json()["id"]]
    bad = client.post(f"{PREFIX}/api/jobs", json={"type": "no.such"})
    assert bad.status_code in (400, 422) and "error" in bad.get_json()


def test_the_api_token_still_works_when_embedded(make_config, registry):
    deck = Jobdeck(make_config(api_token="tok-123"), registry)
    deck.init_db()
    try:
        client = make_host(deck).test_client()
        r = client.post(f"{PREFIX}/api/jobs", json={"type": "demo.noop"}, headers={"Authorization": "Bearer tok-123"})
        assert r.status_code == 201
        wrong = client.get(f"{PREFIX}/api/jobs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.get(f"{PREFIX}/api/jobs").status_code == 401
    finally:
        deck.store.engine.dispose()


def test_a_role_jobdeck_does_not_know_is_refused_and_logged(deck, caplog):
    client = make_host(deck, login_url=None, current_role=lambda: "admin").test_client()
    with caplog.at_level(logging.ERROR, logger="jobdeck.embed"):
        assert client.get(f"{PREFIX}/").status_code == 403
        assert client.get(f"{PREFIX}/api/jobs").status_code == 401
    assert "'admin'" in caplog.text


@pytest.mark.parametrize(
    "prefix", ["", "/", "ops", "/ops/", "/ops//jobs", "/ops/../jobs", "/ops/./jobs", "/ops jobs", "/ops/jöbs", None]
)
def test_a_bad_prefix_is_a_config_error_naming_it(deck, prefix):
    with pytest.raises(ConfigError, match="url_prefix"):
        deck.init_app(Flask("h"), prefix, current_role=lambda: None)


def test_bad_mount_arguments_are_config_errors(deck):
    host = Flask("h")
    with pytest.raises(ConfigError, match="current_role"):
        deck.init_app(host, PREFIX, current_role="operator")
    with pytest.raises(ConfigError, match="login_url"):
        deck.init_app(host, PREFIX, current_role=lambda: None, login_url="https://evil.example/login")
    with pytest.raises(ConfigError, match="login_url"):
        deck.init_app(host, PREFIX, current_role=lambda: None, login_url="//evil.example/login")
    deck.init_app(host, PREFIX, current_role=lambda: None)
    with pytest.raises(ConfigError, match="already mounted"):
        deck.init_app(host, "/other", current_role=lambda: None)


def test_the_signing_key_is_derived_from_the_hosts_not_equal_to_it(make_config, registry):
    deck = Jobdeck(make_config(secret_key=""), registry)
    deck.init_db()
    try:
        host = Flask("h")
        host.secret_key = "host-secret"
        mounted = deck.init_app(host, PREFIX, current_role=lambda: "operator")
        key = mounted.config["SECRET_KEY"]
        assert key and key != "host-secret"
        again = Flask("h2")
        again.secret_key = "host-secret"
        other = Jobdeck(make_config(secret_key=""), registry)
        try:
            assert other.init_app(again, PREFIX, current_role=lambda: None).config["SECRET_KEY"] == key
        finally:
            other.store.engine.dispose()
    finally:
        deck.store.engine.dispose()


def test_a_producer_only_enqueues_no_thread_no_web(db_url, tmp_path, registry):
    before = set(threading.enumerate())
    producer = Jobdeck.from_config(
        env={}, registry=registry, database_url=db_url, instance_path=str(tmp_path / "i"), workers=4
    )
    try:
        job, created = producer.enqueue("demo.noop", {"order": 7}, queue="mail")
        assert created and job.status is State.PENDING and job.queue == "mail"
        again, created = producer.enqueue("demo.noop", {"order": 7}, idempotency_key="order-7")
        assert producer.enqueue("demo.noop", {"order": 7}, idempotency_key="order-7") == (again, False)
        assert set(threading.enumerate()) - before == set()  # no workers, no scheduler, no server
    finally:
        producer.store.engine.dispose()


def test_from_config_reads_a_file_and_names_bad_keys(tmp_path, registry, db_url):
    path = tmp_path / "jobdeck.toml"
    path.write_text(f'database_url = "{db_url}"\nworkers = 0\n')
    producer = Jobdeck.from_config(path, env={}, registry=registry)
    try:
        assert producer.config.database_url == db_url
        assert producer.enqueue("demo.noop")[1]
    finally:
        producer.store.engine.dispose()
    with pytest.raises(ConfigError, match="no_such_key"):
        Jobdeck.from_config(path, env={}, registry=registry, no_such_key=1)


def test_start_and_stop_run_the_workers_through_the_runtime(live_deck):
    before = set(threading.enumerate())
    job, _ = live_deck.enqueue("demo.noop", {})
    runtime = live_deck.start(workers=2, scheduler=False)
    try:
        assert live_deck.start() is runtime  # a second start is the same runtime, not another pool
        wait_for(lambda: live_deck.store.get(job.id).status is State.COMPLETED, timeout=15, message="job completed")
    finally:
        live_deck.stop(grace=2)
    live_deck.stop()  # stopping twice is harmless
    assert [t.name for t in set(threading.enumerate()) - before] == []  # every thread it started has ended


FORKED_HOST = """
import os, sys, time
from jobdeck import Jobdeck
from jobdeck.core.states import State

deck = Jobdeck.from_config(env={}, database_url=sys.argv[1], instance_path=sys.argv[2], workers=2, demo=True)
job, _ = deck.enqueue("demo.noop", {})  # the parent holds pooled connections now, as gunicorn --preload's master would
pid = os.fork()
if pid == 0:  # post_fork
    deck.start(scheduler=False)
    deadline = time.monotonic() + 20
    while deck.store.get(job.id).status is not State.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.02)
    done = deck.store.get(job.id).status is State.COMPLETED
    deck.stop(grace=2)  # worker_exit
    os._exit(0 if done else 1)
deadline = time.monotonic() + 20  # the parent reads meanwhile: shared sockets would interleave
while deck.store.get(job.id).status is not State.COMPLETED and time.monotonic() < deadline:
    deck.store.counts(deck.clock())
_, status = os.waitpid(pid, 0)
print(deck.store.get(job.id).status.value, os.waitstatus_to_exitcode(status))
"""


@pytest.mark.slow
def test_start_in_a_forked_process_drops_the_inherited_connections(db_url, tmp_path):
    """gunicorn --preload with a post_fork hook, in a real subprocess that forks."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", FORKED_HOST, db_url, str(tmp_path / "i")],
        capture_output=True, text=True, timeout=45,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["completed", "0"], result.stderr


def test_middleware_added_after_init_app_wraps_both_apps(host):
    """A proxy's prefix (``ProxyFix(x_prefix=1)``, installed after ``init_app``
    as the README says) lands before Jobdeck's: its URLs carry both."""
    from werkzeug.middleware.proxy_fix import ProxyFix

    host.wsgi_app = ProxyFix(host.wsgi_app, x_prefix=1)
    client = host.test_client()
    log_in(client, "ada")
    html = client.get(f"{PREFIX}/", headers={"X-Forwarded-Prefix": "/app"}).get_data(as_text=True)
    assert f'href="/app{PREFIX}/static/css/dashboard.css"' in html
    r = client.get(f"{PREFIX}/jobs", headers={"X-Forwarded-Prefix": "/app"})
    assert r.status_code == 302 and r.headers["Location"] == f"/app{PREFIX}/jobs/pending"


def test_start_runs_the_scheduler_by_default_and_stop_ends_it(live_deck):
    before = set(threading.enumerate())
    runtime = live_deck.start(workers=1)
    try:
        assert any(type(s).__name__ == "SchedulerService" for s in runtime.services)
        assert set(threading.enumerate()) - before  # it did start threads
    finally:
        live_deck.stop(grace=2)
    wait_for(lambda: not (set(threading.enumerate()) - before), timeout=10, message="the runtime's threads ended")


def test_a_current_role_that_raises_refuses_and_logs(deck, caplog):
    """The issue's own example, ``current_user.is_admin``, raises for
    flask-login's anonymous user: that person is refused, not served a 500."""

    def role() -> str:
        raise AttributeError("'AnonymousUserMixin' object has no attribute 'is_admin'")

    client = make_host(deck, current_role=role).test_client()
    with caplog.at_level(logging.ERROR, logger="jobdeck.embed"):
        assert client.get(f"{PREFIX}/jobs/dead").status_code == 302
        assert client.get(f"{PREFIX}/api/jobs").status_code == 401
    assert "is_admin" in caplog.text
