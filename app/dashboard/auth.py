"""Login, roles and the guard in front of every dashboard page.

With users configured, every page but the login form needs a session; a
``viewer`` may look, an ``operator`` may also act. With none configured the
dashboard is open and everyone is an operator, which the CLI allows only on
a loopback bind (``exposure_problem``). The JSON API keeps its bearer token
and is not guarded here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

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
from werkzeug.security import check_password_hash, generate_password_hash

from app.config import Config
from app.dashboard.settings import OPERATOR, DashboardSettings, User, load_users

bp = Blueprint("auth", __name__)

F = TypeVar("F", bound=Callable[..., Any])

OPEN_USER = User("local operator", "", OPERATOR)
"""Who acts when no users are configured (loopback development)."""

# A hash to check against for unknown names, so a wrong name and a wrong
# password take the same time.
_DUMMY_HASH = generate_password_hash("jobdeck-no-such-user")

PUBLIC_ENDPOINTS = {"static", "auth.login"}


def settings() -> DashboardSettings:
    s: DashboardSettings = current_app.extensions["jobdeck_dashboard"]
    return s


def current_user() -> User | None:
    """The signed-in user, OPEN_USER without users, None when signed out."""
    if "jobdeck_user" in g.__dict__:
        return g.jobdeck_user  # type: ignore[no-any-return]
    s = settings()
    user: User | None
    if s.open_access:
        user = OPEN_USER
    else:
        name = session.get("user")
        user = s.users.get(name) if isinstance(name, str) else None
    g.jobdeck_user = user
    return user


def guard() -> Any:
    """before_request: everything but the API, static files and the login
    form needs a signed-in user when users are configured."""
    endpoint = request.endpoint or ""
    if request.path.startswith("/api/") or endpoint in PUBLIC_ENDPOINTS or not endpoint:
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
            from app.dashboard.views import flash_response

            return flash_response("Your role is viewer: you can look, but only operators can act.", "error", 403)
        return view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _safe_next(target: str | None) -> str:
    if not target:
        return url_for("dashboard.overview")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("dashboard.overview")
    return target


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    s = settings()
    if s.open_access:
        return redirect(url_for("dashboard.overview"))
    error = None
    name = ""
    if request.method == "POST":
        name = request.form.get("username", "")
        password = request.form.get("password", "")
        user = s.users.get(name)
        ok = check_password_hash(user.password_hash if user else _DUMMY_HASH, password)
        if user is not None and ok:
            session.clear()
            session["user"] = user.name
            session.permanent = False
            return redirect(_safe_next(request.args.get("next")))
        error = "Unknown user or wrong password."
    status = 401 if error else 200
    return render_template("login.html", error=error, username=name), status


@bp.post("/logout")
def logout() -> Any:
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
