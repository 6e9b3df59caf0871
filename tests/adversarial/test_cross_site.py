"""A stranger's web page cannot drive Jobdeck, proved in real Chromium.

A live Jobdeck listens on 127.0.0.1; a hostile page is served by a second
HTTP server on another port and opened either as ``http://localhost:PORT``
(another site: Chromium sends ``Sec-Fetch-Site: cross-site``) or as
``http://127.0.0.1:PORT`` (same site, other origin: ``same-site``, and a
SameSite=Lax session cookie still goes along). The page submits text/plain
HTML forms whose body is valid JSON and fires no-cors fetches at POST
/api/jobs and the queue and schedule pause endpoints: the classic drive-by
that worked before. Every request must reach Jobdeck (recorded by a WSGI
wrapper, so the test proves the attack was delivered) and be refused, and
afterwards no job exists and nothing is paused.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from live_server import served
from websec_support import USERS, page_servers

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

TARGETS = ["/api/jobs", "/api/queues/default/pause", "/api/schedules/nightly/pause"]


class Recorder:
    """WSGI wrapper: every API request that reaches Jobdeck, with the headers
    the browser sent and the status Jobdeck answered."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if not environ.get("PATH_INFO", "").startswith("/api/") or environ["REQUEST_METHOD"] != "POST":
            return self.app(environ, start_response)

        def recording_start(status: str, headers: Any, *rest: Any) -> Any:
            with self.lock:
                self.seen.append({
                    "path": environ["PATH_INFO"], "status": int(status.split()[0]),
                    "site": environ.get("HTTP_SEC_FETCH_SITE"), "origin": environ.get("HTTP_ORIGIN"),
                    "type": environ.get("CONTENT_TYPE"), "cookie": "session=" in environ.get("HTTP_COOKIE", ""),
                })  # fmt: skip
            return start_response(status, headers, *rest)

        return self.app(environ, recording_start)

    def posts(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.seen)


def hostile_page(target: str) -> str:
    """Forms (text/plain, whose body is ``name=value``: a name holding the
    JSON's start makes the whole body valid JSON) into hidden iframes, and
    no-cors fetches, all fired on load."""
    body = {"type": "demo.noop", "payload": {}, "pad": ""}
    start = json.dumps(body)[:-2]  # up to the open quote of "pad"
    forms, fetches = [], []
    for i, path in enumerate(TARGETS):
        forms.append(
            f'<iframe name="sink{i}"></iframe>'
            f'<form id="form{i}" method="post" enctype="text/plain" target="sink{i}" action="{target}{path}">'
            f'<input name="{html.escape(start)}" value="&quot;}}"></form>'
        )
        fetches.append(
            f"fetch({json.dumps(target + path)}, {{method: 'POST', mode: 'no-cors', credentials: 'include', "
            f"headers: {{'Content-Type': 'text/plain'}}, body: {json.dumps(json.dumps(body))}}})"
        )
    script = (
        "window.addEventListener('load', () => {"
        + "".join(f"document.getElementById('form{i}').submit();" for i in range(len(TARGETS)))
        + "Promise.allSettled(["
        + ",".join(fetches)
        + "]).then(() => { document.title = 'fired'; });"
        + "});"
    )
    return f"<!doctype html><html><head><title>win a prize</title></head><body>{''.join(forms)}<script>{script}</script></body></html>"


@pytest.fixture
def hostile_server() -> Iterator[Callable[[str], int]]:
    """A second HTTP server on 127.0.0.1 that serves the hostile page aimed at
    the Jobdeck whose base URL is given; returns its port."""
    with page_servers() as serve:
        yield lambda target: serve(hostile_page(target))


def _deck(make_config: Any, registry: Any, **extra: Any) -> Jobdeck:
    config = make_config(schedules=[{"name": "nightly", "cron": "0 3 * * *", "type": "demo.noop"}], **extra)
    deck = Jobdeck(config, registry)
    deck.init_db()
    return deck


def _nothing_changed(deck: Jobdeck) -> None:
    assert sum(deck.store.counts(deck.clock()).values()) == 0, deck.store.counts(deck.clock())
    assert not any(q["paused"] for q in deck.queues.list_queues())
    assert not any(s["paused"] for s in deck.schedules.overview(deck.clock()))


def _attack(page: Any, recorder: Recorder, url: str) -> list[dict[str, Any]]:
    from playwright.sync_api import expect

    page.goto(url)
    expect(page).to_have_title("fired", timeout=15_000)

    # 3 forms and 3 fetches; the forms may land after the fetches settle.
    def all_delivered() -> list[dict[str, Any]] | None:
        posts = recorder.posts()
        return posts if len(posts) >= 2 * len(TARGETS) else None

    delivered: list[dict[str, Any]] = wait_for(all_delivered, timeout=15, message="six hostile requests at Jobdeck")
    # Closing the context drops Chromium's keep-alive connections, which
    # would otherwise keep the waitress loop (and its close) waiting.
    page.context.close()
    return delivered


@pytest.mark.parametrize(("hostile_host", "site"), [("localhost", "cross-site"), ("127.0.0.1", "same-site")])
def test_a_hostile_page_cannot_enqueue_or_pause(page, make_config, registry, hostile_server, hostile_host, site):
    deck = _deck(make_config, registry)
    recorder = Recorder(create_app(deck=deck))
    try:
        with served(recorder) as base:
            port = hostile_server(base)
            posts = _attack(page, recorder, f"http://{hostile_host}:{port}/")
        print(f"\nChromium from http://{hostile_host}:{port} sent: "
              f"{sorted({(p['site'], p['origin'], p['type']) for p in posts})}")  # fmt: skip
        assert {p["path"] for p in posts} == set(TARGETS)
        assert {p["site"] for p in posts} == {site}, posts
        assert all(p["status"] == 403 for p in posts), posts
        _nothing_changed(deck)
    finally:
        deck.store.engine.dispose()


def test_a_signed_in_operator_visiting_a_same_site_page_is_not_ridden(page, make_config, registry, hostile_server):
    """Another port of the same host is the same site: the SameSite=Lax
    session cookie goes along with the hostile requests. Only the origin
    check stands between them and the operator's rights."""
    deck = _deck(make_config, registry, users=USERS)
    recorder = Recorder(create_app(deck=deck))
    try:
        with served(recorder) as base:
            page.goto(f"{base}/login")
            page.fill("input[name=username]", "alice")
            page.fill("input[name=password]", "alice-secret")
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")
            port = hostile_server(base)
            posts = _attack(page, recorder, f"http://127.0.0.1:{port}/")
        assert {p["path"] for p in posts} == set(TARGETS)
        assert any(p["cookie"] for p in posts), "the session cookie should ride along same-site"
        assert all(p["status"] == 403 for p in posts), posts
        _nothing_changed(deck)
    finally:
        deck.store.engine.dispose()
