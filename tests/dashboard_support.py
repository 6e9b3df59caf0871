"""Shared helpers for the dashboard's test-client tests."""

from __future__ import annotations

import re
from typing import Any

from jobdeck import create_app
from jobdeck.deck import Jobdeck

HTMX = {"HX-Request": "true"}


def csrf_token(client: Any) -> str:
    """The token the layout hands to htmx (hx-headers on <body>)."""
    html = client.get("/jobs/pending").get_data(as_text=True)
    match = re.search(r'"X-CSRFToken": "([^"]+)"', html)
    assert match, "no CSRF token in the layout"
    return match.group(1)


def post(client: Any, url: str, data: dict[str, Any] | None = None, *, htmx: bool = True, token: bool = True) -> Any:
    headers = dict(HTMX) if htmx else {}
    if token:
        headers["X-CSRFToken"] = csrf_token(client)
    return client.post(url, data=data or {}, headers=headers)


def make_dash_app(deck: Jobdeck, **extra: Any) -> Any:
    """The app on ``deck`` with the snapshot cache off, so each read is fresh."""
    deck.config.extra.setdefault("dashboard", {}).setdefault("counts_cache_seconds", 0)
    deck.config.extra.update(extra)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return app


def make_dead(deck: Jobdeck, job_type: str = "demo.fail", payload: dict[str, Any] | None = None) -> int:
    """A job run once and failed for good, through the real claim and fail."""
    from jobdeck.store import Outcome

    job, _ = deck.enqueue(job_type, payload or {}, max_retries=0)
    now = deck.clock()
    claimed = deck.store.claim("w1", now, limit=1, types=[job_type])
    assert [j.id for j in claimed] == [job.id]
    deck.store.fail_many([Outcome(job.id, "w1", error="boom\nsecond line", traceback="Traceback: boom")], now)
    return job.id
