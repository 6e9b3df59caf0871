"""How a dashboard view answers: the deck and the snapshot cache it reads,
an action's flash message (in place for htmx, a redirect back otherwise), a
refused input's error. Every dashboard module imports these from here, so
none of them needs another view module for its answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flask import current_app, flash, redirect, render_template, request, url_for

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck
    from jobdeck.store.overview import Snapshots


def deck() -> Jobdeck:
    d: Jobdeck = current_app.extensions["jobdeck"]
    return d


def snapshots() -> Snapshots:
    s: Snapshots = current_app.extensions["jobdeck_snapshots"]
    return s


def is_htmx() -> bool:
    return bool(getattr(request, "htmx", False))


def flash_response(message: str, kind: str = "info", status: int = 200, body: str = "") -> Any:
    """An action's answer: for htmx, ``body`` swapped in place plus the
    message swapped out-of-band into the flash area (nothing else swapped
    when ``body`` is empty); without htmx, the message flashed and a
    redirect back (post/redirect/get)."""
    if not is_htmx():
        flash(message, kind)
        return redirect(_back(), code=303)
    html = body + render_template("_flash.html", messages=[(kind, message)], oob=True)
    response = current_app.response_class(html, status=status, mimetype="text/html")
    if not body:
        response.headers["HX-Reswap"] = "none"
    return response


def error_response(message: str, status: int) -> Any:
    """Refused input on a dashboard page or fragment, shown to the person:
    for htmx the message in the flash area (nothing else swapped), otherwise
    the error page. Never a redirect: the page that was asked for is the one
    that is wrong."""
    if is_htmx():
        html = render_template("_flash.html", messages=[("error", message)], oob=True)
        response = current_app.response_class(html, status=status, mimetype="text/html")
        response.headers["HX-Reswap"] = "none"
        return response
    return render_template("error.html", code=status, message=message), status


def _back() -> str:
    target = request.form.get("next") or request.referrer or ""
    if target.startswith(request.host_url):
        target = "/" + target[len(request.host_url) :]
    return safe_next(target)


def safe_next(target: str | None) -> str:
    """Where to go back to: ``target`` if it is a path of this site, else the
    overview (never another site: an open redirect)."""
    if not target:
        return url_for("dashboard.overview")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("dashboard.overview")
    return target
