"""A live Jobdeck for the browser tests: the real WSGI app served by
waitress on 127.0.0.1 (port 0) in a thread, with a real worker pool, on a
temporary SQLite file; Debian's Chromium headless shell driven by
pytest-playwright.

A missing /usr/bin/chromium-headless-shell fails these tests: CI must never skip them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from live_server import running
from playwright.sync_api import expect

# An assertion on the page waits up to 15 s for what it expects, not
# Playwright's 5: on a loaded machine a dashboard action's answer once took
# longer than 5 s to replace the flash message before it. A page that never
# shows it still fails, only later.
expect.set_options(timeout=15_000)

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-results" / "screenshots"


@dataclass
class Live:
    url: str
    deck: Jobdeck

    def shot(self, page: Any, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def make_live(make_config: Any, registry: Any) -> Iterator[Callable[..., Live]]:
    """Start a live Jobdeck (config overrides as keyword arguments); every
    one started is stopped at teardown."""
    with ExitStack() as stack:

        def start(workers: int = 2, **overrides: Any) -> Live:
            config = make_config(
                workers=workers, backoff_base=0.2, backoff_cap=0.5,
                dashboard={"poll_seconds": 1, "counts_cache_seconds": 0.5}, **overrides,
            )  # fmt: skip
            deck = Jobdeck(config, registry)
            deck.init_db()
            return Live(stack.enter_context(running(deck, create_app(deck=deck), workers)), deck)

        yield start


@pytest.fixture
def live(make_live: Callable[..., Live]) -> Live:
    return make_live()


@pytest.fixture
def dialogs(page: Any) -> list[str]:
    """Every alert/confirm/prompt the page raises (none is expected)."""
    seen: list[str] = []

    def on_dialog(dialog: Any) -> None:
        seen.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


WIDTHS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
"""The two widths every operator task is tried at: a laptop, and a phone
(390 px is an iPhone 12 to 15 in portrait)."""


@contextmanager
def new_page_ready(page: Any) -> Iterator[None]:
    """Around a click (or tap) that opens another page: once the block is
    left, that page is in and its deferred scripts have wired it.

    htmx and dashboard.js are loaded with ``defer`` and wire the page at
    DOMContentLoaded (hx-get, hx-post, the Menu button). A click on such a
    button after the new page's HTML is in but before that event does
    nothing, and the test times out waiting for what it should have shown
    (seen on a busy machine). ``page.goto`` waits for the load event; a click
    that navigates does not. This waits for the navigation the block starts,
    not for the state of whichever page is showing, so the page being left
    cannot answer it."""
    with page.expect_navigation(wait_until="domcontentloaded"):
        yield


def nav(page: Any) -> Any:
    """The main nav, opened first with the Menu button where the width puts
    it behind one (a phone); returns the nav's locator."""
    from playwright.sync_api import expect

    toggle = page.locator("#menu-toggle")
    if toggle.is_visible() and toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
        expect(toggle).to_have_attribute("aria-expanded", "true")
    return page.locator("nav.mainnav")


@pytest.fixture(params=list(WIDTHS))
def width(request: pytest.FixtureRequest, page: Any) -> str:
    """Run the test once at desktop width and once at phone width; the page
    is sized before the test opens anything."""
    page.set_viewport_size(WIDTHS[request.param])
    return str(request.param)
