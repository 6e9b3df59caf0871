"""Who may call the JSON API: the bearer token, a dashboard session, or
(open loopback deployments only) anyone on this machine, but never a
stranger's web page.

The rules, in order, for every API route but ``/api/health`` and
``/api/openapi.json``:

1. A valid ``Authorization: Bearer <api_token>`` may do anything. A browser
   cannot attach it cross-site (the header forces a CORS preflight that
   Jobdeck never grants), so such calls need no origin check.
2. A state-changing call (anything but GET/HEAD/OPTIONS) without the token
   is refused with 403 when a browser says it comes from another origin:
   ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (so another
   port of the same host, which browsers call ``same-site``, is refused too),
   or, from browsers that send no ``Sec-Fetch-Site``, an ``Origin`` whose
   host differs from the request's ``Host``. A client that sends neither
   header (curl, the Python client, an external worker) is not a browser
   riding someone's cookies and proceeds to the next rules.
3. With users configured, the API honours the dashboard's session and role:
   a signed-in viewer may read, only an operator may act (403 otherwise), and
   without a session the answer is 401. So a viewer cannot do through the
   API what the dashboard refuses; scripts use the token. Mounted in a host
   Flask app (``jobdeck.embed``), the host's ``current_role`` is the role here.
4. With an ``api_token`` configured and no users, the token is required (401).
5. With neither (an open deployment), the call proceeds if it comes from
   this machine (a loopback client address) and is addressed to it (a
   loopback ``Host`` or one in ``allowed_hosts``), and is refused with 403
   otherwise: the start-up check (``jobdeck.web.exposure``) trusts ``bind``, which
   another WSGI server may not honour, so the open API also checks the peer;
   and a page that rebinds its own name to 127.0.0.1 comes from a loopback
   peer, same-origin, but names its own host (``jobdeck.web.hosts``).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from flask import current_app, jsonify, request
from jobdeck.core.config import is_loopback_host
from jobdeck.web.dashboard.auth import current_user, settings
from jobdeck.web.hosts import rebinding_problem

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})


def authenticate(public_endpoints: set[str]) -> Any:
    """before_request of every API blueprint: None to proceed, else the refusal."""
    if request.endpoint in public_endpoints:
        return None
    token: str = current_app.extensions["jobdeck"].config.api_token
    header = request.headers.get("Authorization", "")
    if token and header:
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        return _unauthorized("missing or invalid bearer token")
    changes_state = request.method not in SAFE_METHODS
    if changes_state:
        problem = cross_site_problem()
        if problem:
            return _refuse(problem, 403)
    if not settings().open_access:
        user = current_user()
        if user is None:
            return _unauthorized("sign in to the dashboard or send the bearer token")
        if changes_state and not user.can_act:
            return _refuse("your role is viewer: you can look, but only operators can act", 403)
        return None
    if token:
        return _unauthorized("missing or invalid bearer token")
    if not is_loopback_host(request.remote_addr):
        return _refuse(OPEN_REMOTE_MESSAGE, 403)
    problem = rebinding_problem()
    if problem:
        return _refuse(problem, 403)
    return None


OPEN_REMOTE_MESSAGE = "this Jobdeck has no api_token and no users configured: it answers only clients on this machine"


def cross_site_problem() -> str | None:
    """Why this request must be a browser's cross-origin one, or None."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        if site.strip().lower() in SAME_ORIGIN_FETCH_SITES:
            return None
        return f"cross-origin request refused (Sec-Fetch-Site: {site[:40]}); send the bearer token"
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower():
        return f"cross-origin request refused (Origin: {origin[:200]}); send the bearer token"
    return None


def _refuse(message: str, status: int) -> Any:
    response = jsonify({"error": message})
    response.status_code = status
    return response


def _unauthorized(message: str) -> Any:
    response = _refuse(message, 401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobdeck"'
    return response
