"""Who may call the JSON API: the bearer token, a dashboard session, or
(open loopback deployments only) anyone on this machine, but never a
stranger's web page.

The rules, in order, for every API route but the public ones
(``/api/health`` and ``/api/openapi.json``: ``jobdeck.web.scopes``):

1. A valid ``Authorization: Bearer <token>`` is the token's: the legacy
   ``api_token`` may do anything; a named token (``jobdeck.web.tokens``) may
   do what its scopes grant (``jobdeck.web.scopes``: 403 naming the scope it
   lacks otherwise), and a confined ``work`` token finds no job outside its
   types and queues (404). An invalid token is 401. A browser cannot attach
   a token cross-site (the header forces a CORS preflight that Jobdeck
   never grants), so such calls need no origin check.
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
4. With a token configured (``api_token`` or ``[api_tokens]``) and no
   users, a token is required (401).
5. With neither (an open deployment), the call proceeds if it comes from
   this machine (a loopback client address) and is addressed to it (a
   loopback ``Host`` or one in ``allowed_hosts``), and is refused with 403
   otherwise: the start-up check (``jobdeck.web.exposure``) trusts ``bind``, which
   another WSGI server may not honour, so the open API also checks the peer;
   and a page that rebinds its own name to 127.0.0.1 comes from a loopback
   peer, same-origin, but names its own host (``jobdeck.web.hosts``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask import current_app, g, jsonify, request
from jobdeck.core.config import is_loopback_host
from jobdeck.core.errors import JobdeckError, JobNotFound
from jobdeck.web import scopes
from jobdeck.web.dashboard.auth import current_user, settings
from jobdeck.web.hosts import rebinding_problem
from jobdeck.web.tokens import INVALID_LABEL, SESSION_LABEL, ApiTokens, Principal, ScopeRefused

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})


def authenticate() -> Any:
    """before_request of every API blueprint and ``/metrics``: None to
    proceed, else the refusal. What is public is the scope table's word."""
    needed = scopes.needed(request.method, request.url_rule.rule if request.url_rule else None)
    if needed == scopes.PUBLIC:
        return None
    tokens = api_tokens()
    header = request.headers.get("Authorization", "")
    if tokens.configured and header:
        scheme, _, given = header.partition(" ")
        principal = tokens.identify(given.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            g.jobdeck_caller = INVALID_LABEL
            return _unauthorized("missing or invalid bearer token")
        g.jobdeck_principal = principal
        g.jobdeck_caller = principal.label
        try:
            _check_scope(principal, needed)
        except (ScopeRefused, JobNotFound) as refused:  # JSON, /metrics too
            return _refuse_with(refused)
        return None
    changes_state = request.method not in SAFE_METHODS
    if changes_state:
        problem = cross_site_problem()
        if problem:
            return _refuse(problem, 403)
    if not settings().open_access:
        user = current_user()
        if user is None:
            return _unauthorized("sign in to the dashboard or send the bearer token")
        g.jobdeck_caller = SESSION_LABEL
        if changes_state and not user.can_act:
            return _refuse("your role is viewer: you can look, but only operators can act", 403)
        return None
    if tokens.configured:
        return _unauthorized("missing or invalid bearer token")
    if not is_loopback_host(request.remote_addr):
        return _refuse(OPEN_REMOTE_MESSAGE, 403)
    problem = rebinding_problem()
    if problem:
        return _refuse(problem, 403)
    return None


def _check_scope(principal: Principal, needed: tuple[str, ...] | None) -> None:
    """Refuse (403) an operation outside the token's scopes, and (404) a job
    outside a confined work token's types and queues, before the view runs."""
    if not principal.named or request.method == "OPTIONS":
        return
    granted = [s for s in needed or () if s in principal.scopes]
    if not granted:
        raise ScopeRefused(principal, needed or ())
    job_id = (request.view_args or {}).get("job_id")
    if principal.confined and job_id is not None:
        job = current_app.extensions["jobdeck"].store.get(job_id)
        if not principal.sees(job.type, job.queue):
            raise JobNotFound(job_id)


def api_tokens() -> ApiTokens:
    """The app's tokens (``create_app`` loads them from the config)."""
    tokens: ApiTokens = current_app.extensions["jobdeck_tokens"]
    return tokens


def principal() -> Principal | None:
    """The bearer token's principal of this request (None: a session, or open access)."""
    found: Principal | None = g.get("jobdeck_principal")
    return found


def actor() -> str:
    """Who the audit log says acted through the API: ``token:NAME`` for a named token, else ``api``."""
    p = principal()
    return p.actor if p is not None else "api"


def worker_id(given: str, max_chars: int) -> str:
    """The worker id an HTTP worker works under (``Principal.worker_id``)."""
    p = principal()
    return p.worker_id(given, max_chars) if p is not None else given


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


def _refuse_with(error: JobdeckError) -> Any:
    response = jsonify(error.to_dict())
    response.status_code = error.status_code
    return response


def _refuse(message: str, status: int) -> Any:
    response = jsonify({"error": message})
    response.status_code = status
    return response


def _unauthorized(message: str) -> Any:
    response = _refuse(message, 401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobdeck"'
    return response
