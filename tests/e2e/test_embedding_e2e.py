"""Jobdeck mounted in a host Flask app at /ops/jobs, in real Chromium: the
host's own login decides the role, an operator acts through htmx, a viewer
cannot, and every static asset loads under the prefix with the CSP intact
(a violation or a failed load would show in the console or the responses).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from embed_host import PREFIX, make_host
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from live_server import served
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def embedded(make_config: Any, registry: Any) -> Iterator[tuple[str, Jobdeck]]:
    """The host app served by waitress, its Jobdeck's workers started the way
    a host process starts them (``Jobdeck.start``)."""
    config = make_config(workers=2, dashboard={"poll_seconds": 1, "counts_cache_seconds": 0.5})
    deck = Jobdeck(config, registry)
    deck.init_db()
    host = make_host(deck)
    try:
        with served(host) as url:
            deck.start(scheduler=False)
            try:
                yield url, deck
            finally:
                deck.stop(grace=2)
    finally:
        deck.store.engine.dispose()


def _watch(page: Any) -> dict[str, list[Any]]:
    """Console errors (a CSP violation is one), failed responses under the
    prefix, and every static file loaded."""
    seen: dict[str, list[Any]] = {"errors": [], "static": [], "failed": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))

    def on_response(r: Any) -> None:
        if "/static/" in r.url:
            seen["static"].append((r.url, r.status))
        if r.status >= 400:
            seen["failed"].append((r.url, r.status))

    page.on("response", on_response)
    return seen


def _host_login(page: Any, url: str, name: str, password: str) -> None:
    page.goto(f"{url}{PREFIX}/jobs/dead")
    expect(page).to_have_title("Host login")  # Jobdeck sent us to the host's own login
    page.get_by_label("User").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}{PREFIX}/jobs/dead")


def test_operator_signs_in_with_the_hosts_login_and_retries_a_job(embedded, page):
    url, deck = embedded
    seen = _watch(page)
    done, _ = deck.enqueue("demo.noop", {"n": 1})
    dead, _ = deck.enqueue("demo.fail", {"message": "card declined"}, max_retries=0)
    wait_for(lambda: deck.store.get(dead.id).status is State.DEAD, timeout=15, message="job dead")

    _host_login(page, url, "ada", "ada-pw")
    expect(page.locator(".who")).to_contain_text("ada")
    expect(page.locator(".who .role")).to_have_text("operator")
    row = page.locator(f"#job-{dead.id}")
    expect(row).to_contain_text("card declined")
    row.get_by_role("button", name="Discard").click()  # an htmx POST with the CSRF header, under the prefix
    expect(page.locator(".flash-success")).to_contain_text(f"Job {dead.id} discarded.")
    assert deck.store.get(dead.id).status is State.DISCARDED

    page.get_by_role("link", name="Jobs").first.click()
    page.wait_for_url(f"{url}{PREFIX}/jobs/**")
    page.goto(f"{url}{PREFIX}/jobs/completed")
    expect(page.locator(f"#job-{done.id}")).to_be_visible(timeout=15_000)
    marker = page.evaluate("() => (window.__marker = Math.random())")
    later, _ = deck.enqueue("demo.noop", {"n": 2})
    expect(page.locator(f"#job-{later.id}")).to_be_visible(timeout=15_000)  # htmx polled under the prefix
    assert page.evaluate("() => window.__marker") == marker  # same document: no reload

    assert page.evaluate("() => typeof window.htmx") == "object"
    statics = {u.split(PREFIX, 1)[-1] for u, _ in seen["static"]}
    assert {"/static/css/dashboard.css", "/static/js/dashboard.js", "/static/vendor/htmx-2.0.11.min.js"} <= statics
    assert all(u.startswith(f"{url}{PREFIX}/static/") and s in (200, 304) for u, s in seen["static"]), seen["static"]
    assert seen["failed"] == []
    assert seen["errors"] == []  # no CSP violation, no failed load
    response = page.request.get(f"{url}{PREFIX}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]

    page.goto(f"{url}/")  # the host's own pages are still the host's
    expect(page.locator("h1")).to_have_text("Welcome ada")


def test_a_viewer_sees_jobs_but_cannot_act(embedded, page):
    url, deck = embedded
    dead, _ = deck.enqueue("demo.fail", {"message": "card declined"}, max_retries=0)
    wait_for(lambda: deck.store.get(dead.id).status is State.DEAD, timeout=15, message="job dead")

    _host_login(page, url, "bob", "bob-pw")
    expect(page.locator(".who .role")).to_have_text("viewer")
    row = page.locator(f"#job-{dead.id}")
    expect(row).to_contain_text("card declined")
    expect(row.get_by_role("button", name="Discard")).to_have_count(0)
    # Forcing the request with the page's own CSRF token is refused too.
    status = page.evaluate(
        """async (url) => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const r = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': token, 'HX-Request': 'true'}});
            return r.status;
        }""",
        f"{PREFIX}/actions/jobs/{dead.id}/discard",
    )
    assert status == 403
    assert deck.store.get(dead.id).status is State.DEAD


def test_a_host_user_without_a_role_never_sees_jobdeck(embedded, page):
    url, _ = embedded
    page.goto(f"{url}/login")
    page.get_by_label("User").fill("eve")
    page.get_by_label("Password").fill("eve-pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Welcome eve")
    page.goto(f"{url}{PREFIX}/")
    expect(page).to_have_title("Host login")  # sent to log in as someone who may
