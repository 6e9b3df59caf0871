"""Attacks on a Jobdeck mounted in a host app at /ops/jobs.

- A stranger's page, in real Chromium, posts forms and no-cors fetches at the
  mounted dashboard actions and API while an operator is signed in to the
  host (on another port of the same host the host's session cookie rides
  along): every request reaches Jobdeck and is refused, and nothing changes.
- Path tricks sent raw over HTTP (no client normalizes them): dot segments,
  encoded dots and slashes, a longer name sharing the prefix, a NUL, case.
  None reaches Jobdeck; the host answers them.
- What the host hands over (the user's name) is escaped and bounded.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from dashboard_support import make_dead
from embed_host import PREFIX, csrf_of, log_in, make_host
from jobdeck.core.states import State
from jobdeck.store.audit import list_audit
from live_server import served
from websec_support import page_servers

from tests.conftest import wait_for


class Recorder:
    """WSGI wrapper around the mounted Jobdeck app: every request that reached it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def recording_start(status: str, headers: Any, *rest: Any) -> Any:
            with self.lock:
                self.seen.append({
                    "method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
                    "status": int(status.split()[0]), "cookie": "session=" in environ.get("HTTP_COOKIE", ""),
                })  # fmt: skip
            return start_response(status, headers, *rest)

        return self.app(environ, recording_start)

    def posts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.seen if s["method"] == "POST"]


@pytest.fixture
def mounted(deck: Any) -> Iterator[tuple[Any, Recorder]]:
    host = make_host(deck)
    jobdeck_app = host.wsgi_app.jobdeck  # the dispatcher's Jobdeck app
    recorder = Recorder(jobdeck_app.wsgi_app)
    jobdeck_app.wsgi_app = recorder
    yield host, recorder


def hostile_page(base: str, job_id: int) -> str:
    targets = [f"{PREFIX}/actions/jobs/{job_id}/discard", f"{PREFIX}/api/jobs", f"{PREFIX}/api/jobs/{job_id}/discard"]
    forms = "".join(
        f'<iframe name="s{i}"></iframe><form id="f{i}" method="post" target="s{i}" action="{base}{t}">'
        f'<input name="from" value="row"></form>'
        for i, t in enumerate(targets)
    )
    fetches = ",".join(
        f"fetch('{base}{t}', {{method: 'POST', mode: 'no-cors', credentials: 'include', "
        f"headers: {{'Content-Type': 'text/plain'}}, body: '{{\"type\": \"demo.noop\"}}'}})"
        for t in targets
    )
    script = (
        "window.addEventListener('load', () => {"
        + "".join(f"document.getElementById('f{i}').submit();" for i in range(len(targets)))
        + f"Promise.allSettled([{fetches}]).then(() => {{ document.title = 'fired'; }});}});"
    )
    return f"<!doctype html><title>prize</title>{forms}<script>{script}</script>"


@pytest.fixture
def hostile_server() -> Iterator[Callable[[str], int]]:
    """A second HTTP server on 127.0.0.1 serving the page given; returns its port."""
    with page_servers() as serve:
        yield lambda body: serve(body)


@pytest.mark.e2e
@pytest.mark.parametrize("hostile_host", ["localhost", "127.0.0.1"])
def test_a_cross_site_form_against_the_mounted_actions_is_refused(
    page, deck, mounted, hostile_server, hostile_host
):  # fmt: skip
    from playwright.sync_api import expect

    host, recorder = mounted
    job_id = make_dead(deck)
    with served(host) as base:
        page.goto(f"{base}/login")
        page.get_by_label("User").fill("ada")
        page.get_by_label("Password").fill("ada-pw")
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("h1")).to_have_text("Welcome ada")
        port = hostile_server(hostile_page(base, job_id))
        page.goto(f"http://{hostile_host}:{port}/")
        expect(page).to_have_title("fired", timeout=15_000)
        posts = wait_for(lambda: (p := recorder.posts()) and len(p) >= 6 and p, timeout=15, message="six posts")
        page.context.close()
    assert {p["path"] for p in posts} == {f"/actions/jobs/{job_id}/discard", "/api/jobs", f"/api/jobs/{job_id}/discard"}
    if hostile_host == "127.0.0.1":  # same site: the host's Lax cookie went along, the origin check stood
        assert any(p["cookie"] for p in posts), posts
    assert all(p["status"] in (400, 403) for p in posts), posts
    assert deck.store.get(job_id).status is State.DEAD
    assert sum(deck.store.counts(deck.clock()).values()) == 1


# ("//ops/jobs/" is not here: waitress itself hands it over as PATH_INFO
# "/ops/jobs/", so the host and Jobdeck agree that it is the prefix.)
TRICKS = [
    f"{PREFIX}/../",
    f"{PREFIX}/..",
    f"{PREFIX}/../private",
    f"{PREFIX}/%2e%2e/",
    f"{PREFIX}/%2E%2E/private",
    f"{PREFIX}%2F..%2Fprivate",
    f"{PREFIX}/./../api/jobs",
    f"{PREFIX}X",
    f"{PREFIX}X/api/jobs",
    f"{PREFIX}-admin/",
    f"{PREFIX}%00/api/jobs",
    "/OPS/JOBS/",
    f"{PREFIX.replace('/jobs', '//jobs')}/",
    f"/x/..{PREFIX}x/",
]


def _raw(base: str, path: str) -> http.client.HTTPResponse:
    """GET ``path`` exactly as written: http.client does not normalize."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def test_path_tricks_do_not_reach_jobdeck(mounted):
    host, recorder = mounted
    with served(host) as base:
        answers = {path: _raw(base, path) for path in TRICKS}
        reached = list(recorder.seen)
        control = _raw(base, f"{PREFIX}/x/../api/health")  # resolves inside the prefix: Jobdeck's
    print(f"\n{len(TRICKS)} path tricks, statuses: {sorted({r.status for r in answers.values()})}")
    assert reached == [], reached
    assert all(r.getheader("X-Served-By") == "host" for r in answers.values())
    assert all(r.status < 500 for r in answers.values())
    assert control.status == 200 and control.getheader("X-Served-By") is None
    assert recorder.seen[-1]["path"] == "/api/health"


def test_hostile_path_bytes_under_the_prefix_are_4xx(mounted):
    host, _ = mounted
    client = host.test_client()
    log_in(client, "ada")
    for path in ["/jobs/%00", "/jobs/99999999999999999999999", "/static/..%2f..%2fpyproject.toml", "/api/jobs/%00"]:
        assert 400 <= client.get(PREFIX + path).status_code < 500, path
    deep = "[" * 5000 + "]" * 5000
    r = client.post(f"{PREFIX}/api/jobs", data='{"type": "demo.noop", "payload": {"a": ' + deep + "}}",
                    content_type="application/json")  # fmt: skip
    assert 400 <= r.status_code < 500 and "error" in r.get_json()


def test_the_hosts_user_name_is_escaped_and_bounded(deck):
    hostile = "<script>alert(1)</script>" + "x" * 10_000
    host = make_host(deck, current_name=lambda: hostile)
    client = host.test_client()
    log_in(client, "ada")
    html = client.get(f"{PREFIX}/").get_data(as_text=True)
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "x" * 300 not in html


@pytest.mark.backends
def test_a_host_name_with_nul_and_control_bytes_is_cleaned_before_the_audit_log(deck):
    """PostgreSQL refuses NUL in text: a name straight from the host's user
    table must not turn an operator's action into a 500."""
    job_id = make_dead(deck)
    host = make_host(deck, current_name=lambda: "ada\x00\x1b[31m\u202e" + "y" * 500)
    client = host.test_client()
    log_in(client, "ada")
    token = csrf_of(client.get(f"{PREFIX}/jobs/dead").get_data(as_text=True))
    r = client.post(f"{PREFIX}/actions/jobs/{job_id}/discard", headers={"HX-Request": "true", "X-CSRFToken": token})
    assert r.status_code == 200
    actor = list_audit(deck.store)[0][0].actor
    assert actor.startswith("ada[31m") and len(actor) == 200 and "\x00" not in actor
