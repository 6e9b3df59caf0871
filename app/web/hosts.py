"""Which names a request may be addressed to when Jobdeck is open (no users,
no token): this machine's, or one in ``allowed_hosts``. Both guards ask it,
the API's (``jobdeck.web.guard``) and the dashboard's
(``jobdeck.web.dashboard.auth``), so it sits below both."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import current_app, request
from jobdeck.core.config import is_loopback_host


def rebinding_problem() -> str | None:
    """For an open deployment: why this request's ``Host`` is not this
    machine's, or None. DNS rebinding points a hostile page's own name at
    127.0.0.1, so its requests arrive from a loopback peer and look
    same-origin to the browser; only the ``Host`` they carry gives them away."""
    host = (urlsplit("//" + request.host).hostname or "").lower()
    allowed = current_app.extensions["jobdeck"].config.allowed_hosts
    if is_loopback_host(host) or host in {name.lower() for name in allowed}:
        return None
    return (
        f"this Jobdeck has no users configured and answers only requests addressed to this machine, "
        f"not to {host[:100]!r}; add the name to allowed_hosts if it is yours"
    )
