"""The refusal to serve an open Jobdeck beyond loopback.

``jobdeck serve`` and ``wsgi.py`` both call ``exposure_problem`` before
building the app, so no entry point can expose an API without a token (the
``api_token`` or any ``[api_tokens.NAME]``: ``jobdeck.web.tokens``) or a
dashboard without users. ``bind`` is the address checked: under another
WSGI server (gunicorn, ...) set ``JOBDECK_BIND`` to the address it listens on.
"""

from __future__ import annotations

from collections.abc import Callable

from jobdeck.core.config import Config, ConfigError
from jobdeck.web.tokens import load_tokens

EXPOSURE_CHECKS: list[Callable[[Config], str | None]] = []
"""Further checks other parts add; each returns a problem or None."""


def exposure_problem(config: Config) -> str | None:
    """Why this configuration must not start, or None when it may."""
    if not config.is_loopback:
        try:
            tokens = load_tokens(config)
        except ConfigError as exc:
            return f"invalid configuration: {exc}"
        if not tokens.configured:
            return (
                f"bind: refusing to listen on {config.bind} (not loopback) with no api_token configured "
                "(nor any [api_tokens.NAME]); add a named token (`jobdeck token create`), set "
                "JOBDECK_API_TOKEN, or bind to 127.0.0.1"
            )
    from jobdeck.web.dashboard.auth import exposure_problem as dashboard_problem

    for check in (dashboard_problem, *EXPOSURE_CHECKS):
        problem = check(config)
        if problem:
            return problem
    return None
