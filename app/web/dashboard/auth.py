"""Login, roles and the guard in front of every dashboard page.

With users configured, every page but the login form needs a session; a
``viewer`` may look, an ``operator`` may also act. With none configured the
dashboard is open and everyone is an operator, which ``jobdeck serve`` and
``wsgi.py`` allow only on a loopback bind (``exposure_problem``).

A session is a row in the database (``jobdeck.store.sessions``) named by a token in
the signed cookie: logout deletes the row, so a copied cookie stops working
in every process; so does a change of the user's password or role in the
config (the row keeps a fingerprint of both). Logins are throttled before any password is hashed
(``jobdeck.web.dashboard.throttle``). The JSON API honours the same sessions and
roles when users are configured (``jobdeck.web.guard``). Mounted in a host app
(``jobdeck.embed``), the host's ``current_role`` decides instead of sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps
from typing import TYPE_CHECKING, Any, TypeVar

from flask import (
    Blueprint,
    current_app,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from jobdeck.core.config import Config, is_loopback_host
from jobdeck.store import sessions
from jobdeck.web.dashboard.replies import deck as _deck
from jobdeck.web.dashboard.replies import flash_response, safe_next
from jobdeck.web.dashboard.settings import OPERATOR, DashboardSettings, User, load_users
from jobdeck.web.dashboard.throttle import LoginThrottle
from jobdeck.web.hosts import rebinding_problem
from werkzeug.security import check_password_hash, generate_password_hash

if TYPE_CHECKING:
    from jobdeck.embed import Embedding

bp = Blueprint("auth", __name__)

F = TypeVar("F", bound=Callable[..., Any])

OPEN_USER = User("local operator", "", OPERATOR)
"""Who acts when no users are configured (loopback development)."""


@cache
def _dummy_hash() -> str:
    """A hash to check against for unknown names, so a wrong name and a wrong
    password take the same time. Made at the first sign-in, not at import:
    every process that imports the dashboard (each CLI command, each worker
    host) paid a password hash to start, and only a login form uses it."""
    return generate_password_hash("jobdeck-no-such-user")


PUBLIC_ENDPOINTS = {"static", "auth.login"}


def settings() -> DashboardSettings:
    s: DashboardSettings = current_app.extensions["jobdeck_dashboard"]
    return s


def throttle() -> LoginThrottle:
    t: LoginThrottle = current_app.extensions["jobdeck_login_throttle"]
    return t


def embedding() -> Embedding | None:
    """The host app this Jobdeck is mounted in (``jobdeck.embed``), or None."""
    found: Embedding | None = current_app.extensions.get("jobdeck_embedding")
    return found


def current_user() -> User | None:
    """The signed-in user, OPEN_USER without users, None when signed out.
    A session counts only while its row exists (logout deletes it)."""
    if "jobdeck_user" in g.__dict__:
        return g.jobdeck_user  # type: ignore[no-any-return]
    s = settings()
    user: User | None = None
    mounted = embedding()
    if mounted is not None:
        user = mounted.user()
    elif s.open_access:
        user = OPEN_USER
    else:
        name, token = session.get("user"), session.get("sid")
        if isinstance(name, str) and isinstance(token, str) and name in s.users:
            deck = _deck()
            known = s.users[name]
            if sessions.session_user(deck.store, token, known.credential, deck.clock()) == name:
                user = known
    g.jobdeck_user = user
    return user


API_GUARDED_ENDPOINTS = {"metrics.metrics"}
"""Endpoints outside /api/ that the API's own guard (``jobdeck.web.guard``) protects."""


def guard() -> Any:
    """before_request: everything but the API, static files and the login
    form needs a signed-in user when users are configured; without users,
    only clients on this machine are answered."""
    endpoint = request.endpoint or ""
    if request.path.startswith("/api/") or endpoint in API_GUARDED_ENDPOINTS:
        return None
    mounted = embedding()
    if mounted is not None:
        if endpoint == "static" or current_user() is not None:
            return None
        return mounted.refusal()
    if settings().open_access and not is_loopback_host(request.remote_addr):
        # The start-up check trusts ``bind``, which another WSGI server may
        # not honour: an open dashboard also checks who is asking.
        message = "This dashboard has no users configured: it answers only this machine."
        return render_template("error.html", code=403, message=message), 403
    if settings().open_access:
        problem = rebinding_problem()
        if problem:
            return render_template("error.html", code=403, message=problem), 403
    if endpoint in PUBLIC_ENDPOINTS or not endpoint:
        return None
    if current_user() is not None:
        return None
    target = url_for("auth.login", next=request.full_path if request.method == "GET" else None)
    if request.headers.get("HX-Request") == "true":
        response = current_app.response_class("", status=401)
        response.headers["HX-Redirect"] = target
        return response
    return redirect(target)


def require_operator(view: F) -> F:
    """Refuse viewers with 403 and a visible message. Any blueprint (the
    schedules page, ...) can wrap its POST views with this."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        user = current_user()
        if user is None or not user.can_act:
            return flash_response("Your role is viewer: you can look, but only operators can act.", "error", 403)
        return view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    s = settings()
    if s.open_access or s.embedded:  # embedded, the guard let only a host-approved user reach this
        return redirect(url_for("dashboard.overview"))
    if request.method == "GET":
        return render_template("login.html", error=None, username="")
    name = request.form.get("username", "")
    password = request.form.get("password", "")
    t = throttle()
    keys = t.keys(name, request.remote_addr)
    wait = t.retry_after(keys)
    if wait is not None:
        return _too_many(name, f"Too many failed sign-ins; try again in {wait} seconds.", wait)
    with t.hashing() as slot:
        if not slot:
            return _too_many(name, "Too many sign-ins at once; try again in a moment.", 1)
        wait = t.retry_after(keys)  # again: a failure may have been counted while this one waited
        if wait is not None:
            return _too_many(name, f"Too many failed sign-ins; try again in {wait} seconds.", wait)
        dummy = _dummy_hash()  # made before the name is looked up: the first sign-in pays for it, known name or not
        user = s.users.get(name)
        ok = check_password_hash(user.password_hash if user else dummy, password) and user is not None
        if not ok:
            t.failed(keys)  # counted before the slot is released: no concurrent attempt slips past the limit
    if ok and user is not None:
        t.succeeded(keys[0])
        deck = _deck()
        token = sessions.open_session(deck.store, user.name, user.credential, deck.clock())
        session.clear()
        session["user"] = user.name
        session["sid"] = token
        session.permanent = False
        return redirect(safe_next(request.args.get("next")))
    return render_template("login.html", error="Unknown user or wrong password.", username=name), 401


def _too_many(name: str, message: str, retry_after: int) -> Any:
    response = current_app.response_class(render_template("login.html", error=message, username=name), status=429)
    response.headers["Retry-After"] = str(retry_after)
    return response


@bp.post("/logout")
def logout() -> Any:
    """End the session in the database too, so a copy of the cookie is dead."""
    token = session.get("sid")
    if isinstance(token, str):
        sessions.close_session(_deck().store, token)
    session.clear()
    return redirect(url_for("auth.login"))


def exposure_problem(config: Config) -> str | None:
    """An EXPOSURE_CHECKS entry: no dashboard without users beyond loopback."""
    if config.is_loopback:
        return None
    try:
        users = load_users(config)
    except ValueError as exc:
        return f"invalid configuration: {exc}"
    if not users:
        return (
            f"bind: refusing to serve the dashboard on {config.bind} (not loopback) with no users "
            "configured; add a [users.NAME] table with a password_hash from `jobdeck hash-password`, "
            "or bind to 127.0.0.1"
        )
    return None
