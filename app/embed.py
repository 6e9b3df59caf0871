"""Jobdeck inside an existing Flask app: the whole dashboard and API under a
prefix of the host, with the host's login deciding who may look and act.

``Jobdeck.init_app(host, url_prefix="/ops/jobs", current_role=...)`` builds
Jobdeck's own Flask app (``create_app(deck=...)``) and puts a WSGI dispatcher
in front of the host's: a request whose path is the prefix or below it goes
to Jobdeck with the prefix moved from ``PATH_INFO`` to ``SCRIPT_NAME``, so
``url_for``, static files, htmx URLs and redirects all carry the prefix, and
every other request goes to the host untouched. The decision is made on the
path with its dot segments resolved (as a browser would), so
``/ops/jobs/../admin`` is the host's ``/admin`` and ``/ops/jobsX`` is the
host's too.

Who is asking is the host's business: ``current_role`` is called inside the
HOST app's request context for the same request (so ``flask_login``'s
``current_user`` and the host's session work there) and returns ``"viewer"``,
``"operator"`` or None (the host's ``before_request`` functions are not run
for it: they may refuse or protect what is Jobdeck's). None is refused (403, or a redirect to the host's
``login_url``); Jobdeck's own ``[users]`` and login form are not used. The
API honours the same role for browser calls, and a bearer ``api_token`` (if
configured) still works for scripts and HTTP workers (``jobdeck.web.guard``).
Jobdeck keeps its own signed session only for CSRF tokens and flash messages:
a cookie of its own name, path-scoped to the prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from flask import Flask, current_app, request
from flask.sessions import SecureCookieSessionInterface
from jobdeck.core.config import ConfigError
from jobdeck.web.dashboard.settings import ROLES, User

log = logging.getLogger("jobdeck.embed")

HOST_ENVIRON = "jobdeck.host_environ"
"""The WSGI environ key under which a mounted request carries the host's
view of it (the original ``SCRIPT_NAME`` and ``PATH_INFO``)."""

SESSION_COOKIE = "jobdeck_session"
"""Not Flask's ``session``: the host's own session cookie keeps its name."""

DEFAULT_NAME = "host user"
"""Who the audit log names when the host gives no ``current_name``."""

MAX_NAME_CHARS = 200
"""The audit log's ``actor`` column holds 200 characters."""

_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/")


def check_prefix(prefix: Any) -> str:
    """The mount point as ``init_app`` accepts it: ``/a/b``, plain URL
    characters, no empty or dot segment, no trailing slash."""
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix == "/":
        raise ConfigError(f"url_prefix: expected a path such as '/ops/jobs', got {prefix!r}")
    if len(prefix) > 200 or not _PREFIX_CHARS.issuperset(prefix):
        raise ConfigError(f"url_prefix: only letters, digits and - . _ ~ / are allowed, got {prefix[:200]!r}")
    segments = prefix[1:].split("/")
    if any(part in ("", ".", "..") for part in segments):
        raise ConfigError(f"url_prefix: no empty, '.' or '..' segment and no trailing slash, got {prefix!r}")
    return prefix


def resolve_dots(path: str) -> str:
    """``path`` with its ``.`` and ``..`` segments resolved (RFC 3986 5.2.4,
    as a browser resolves a URL): what the request really names. Empty
    segments stay, so ``//ops/jobs`` is not ``/ops/jobs``."""
    parts = path.split("/")[1:] if path.startswith("/") else path.split("/")
    out: list[str] = []
    for part in parts:
        if part == "..":
            if out:
                out.pop()
        elif part != ".":
            out.append(part)
    trailing = bool(out) and bool(parts) and parts[-1] in (".", "..")
    return "/" + "/".join(out) + ("/" if trailing else "")


class PrefixDispatcher:
    """WSGI: the prefix and below to Jobdeck, everything else to the host."""

    def __init__(self, host: Callable[..., Iterable[bytes]], jobdeck: Flask, prefix: str) -> None:
        self.host = host
        self.jobdeck = jobdeck
        self.prefix = prefix

    def inner_path(self, path_info: str) -> str | None:
        """Jobdeck's ``PATH_INFO`` for a host path, or None: not Jobdeck's."""
        path = resolve_dots(path_info)
        if path == self.prefix:
            return "/"
        if path.startswith(self.prefix + "/"):
            return path[len(self.prefix) :]
        return None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        inner = self.inner_path(environ.get("PATH_INFO", ""))
        if inner is None:
            return self.host(environ, start_response)
        mounted = dict(environ)
        mounted["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "").rstrip("/") + self.prefix
        mounted["PATH_INFO"] = inner
        mounted[HOST_ENVIRON] = environ
        return self.jobdeck.wsgi_app(mounted, start_response)


@dataclass(frozen=True)
class Embedding:
    """How a mounted Jobdeck learns who is asking (``jobdeck.web.dashboard.auth``)."""

    host: Flask
    prefix: str
    current_role: Callable[[], str | None]
    current_name: Callable[[], str | None] | None = None
    login_url: str | None = None

    def user(self) -> User | None:
        """The host's verdict on this request, as a Jobdeck user (None: no role)."""
        host_environ = request.environ.get(HOST_ENVIRON)
        if host_environ is None:  # served directly, not through the dispatcher: nobody vouched
            return None
        with self.host.request_context(host_environ):
            try:
                role = self.current_role()
                name = self.current_name() if role is not None and self.current_name is not None else None
            except Exception:  # e.g. ``current_user.is_admin`` on an anonymous user: no role, and say why
                log.exception("current_role raised: refused")
                return None
        if role is None:
            return None
        if role not in ROLES:
            log.error("current_role returned %r; expected %s or None: refused", role, " or ".join(map(repr, ROLES)))
            return None
        label = "".join(ch for ch in str(name or "")[:1000] if ch.isprintable())[:MAX_NAME_CHARS].strip()
        return User(label or DEFAULT_NAME, "", role)

    def refusal(self) -> Any:
        """The answer to a dashboard request with no role: the host's login
        (back here afterwards) when ``login_url`` is set, else 403."""
        from flask import redirect, render_template

        if self.login_url:
            htmx = request.headers.get("HX-Request") == "true"
            back = _page_of_fragment() if htmx else None
            if not htmx and request.method == "GET":
                back = request.script_root + request.full_path.rstrip("?")
            sep = "&" if "?" in self.login_url else "?"
            target = self.login_url + (sep + urlencode({"next": back}, quote_via=quote) if back else "")
            if htmx:
                response = current_app.response_class("", status=401)
                response.headers["HX-Redirect"] = target
                return response
            return redirect(target)
        message = "You are signed out of this application, or your account may not see Jobdeck."
        return render_template("error.html", code=403, message=message), 403


def _page_of_fragment() -> str:
    """Where to come back to after the host's login when an htmx request was
    refused: the page it was made from (``HX-Current-URL``, if it is a
    Jobdeck page of this host), not the fragment itself."""
    current = urlsplit(request.headers.get("HX-Current-URL", "")[:2000])
    root = request.script_root
    if current.netloc == request.host and (current.path == root or current.path.startswith(root + "/")):
        return current.path + (f"?{current.query}" if current.query else "")
    return root + "/"


class PrefixSessionInterface(SecureCookieSessionInterface):
    """Jobdeck's session cookie, scoped to the mount point: the host's other
    pages never receive it."""

    def get_cookie_path(self, app: Flask) -> str:
        return request.script_root or "/"


def mount(
    build: Callable[[], Flask],
    secret_key: str | None,
    host: Flask,
    url_prefix: str,
    current_role: Callable[[], str | None],
    *,
    current_name: Callable[[], str | None] | None = None,
    login_url: str | None = None,
) -> Flask:
    """``Jobdeck.init_app``: build Jobdeck's app (``build``, once the
    arguments are checked) and mount it on ``host``, its sessions signed
    with ``secret_key`` or, without one, a key derived from the host's."""
    from jobdeck.web.dashboard.settings import DashboardSettings

    prefix = check_prefix(url_prefix)
    if not callable(current_role):
        raise ConfigError("current_role: expected a function returning 'viewer', 'operator' or None")
    if current_name is not None and not callable(current_name):
        raise ConfigError("current_name: expected a function returning the user's name")
    if login_url is not None and (
        not isinstance(login_url, str) or not login_url.startswith("/") or login_url.startswith("//")
    ):
        raise ConfigError(f"login_url: expected a path on the host such as '/login', got {login_url!r}")
    if host.extensions.get("jobdeck") is not None:
        raise ConfigError("init_app: a Jobdeck is already mounted on this app")

    app = build()
    app.config["SECRET_KEY"] = secret_key or _derived_secret(host)
    app.config["SESSION_COOKIE_NAME"] = SESSION_COOKIE
    app.config["APPLICATION_ROOT"] = prefix  # url_for outside a request builds under the prefix too
    app.session_interface = PrefixSessionInterface()
    settings: DashboardSettings = app.extensions["jobdeck_dashboard"]
    app.extensions["jobdeck_dashboard"] = replace(settings, embedded=True)
    app.extensions["jobdeck_embedding"] = Embedding(host, prefix, current_role, current_name, login_url)
    host.wsgi_app = PrefixDispatcher(host.wsgi_app, app, prefix)  # type: ignore[method-assign]
    host.extensions["jobdeck"] = app.extensions["jobdeck"]
    return app


def _derived_secret(host: Flask) -> str:
    """Jobdeck's signing key from the host's (every process of the host then
    agrees on CSRF tokens), but not the host's key itself; a random one when
    neither is set (then tokens hold in one process only: set ``secret_key``)."""
    base = host.secret_key
    if not base:
        log.warning("neither the host's SECRET_KEY nor Jobdeck's secret_key is set: CSRF tokens hold in one process")
        return secrets.token_hex(32)
    key = base if isinstance(base, bytes) else str(base).encode()
    return hmac.new(key, b"jobdeck embedded session", hashlib.sha256).hexdigest()
