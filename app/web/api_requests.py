"""API requests counted by the token that made them, for ``/metrics``
(``jobdeck_api_requests_total{token, code}``).

The ``token`` label is a name from ``[api_tokens]`` or one of the fixed
labels (``jobdeck.web.tokens.FIXED_LABELS``): ``api_token`` (the legacy
token), ``session`` (a dashboard session), ``invalid`` (a bearer token that
matched none) and ``anonymous`` (no credentials: the public routes, an open
deployment, a refused call). A client cannot add a label: however many
tokens it makes up, they all count as ``invalid``. ``code`` is the answer's
HTTP status. Counted in this process since it started (unlike the job
figures, which every process reads alike from the database).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from flask import Flask, g, request
from jobdeck.web.tokens import ANONYMOUS_LABEL

API_PREFIX = "/api/"
GUARDED_OUTSIDE_API = frozenset({"metrics.metrics"})
"""Endpoints outside /api/ that the API's guard protects, and that count."""


class RequestCounts:
    """Requests per (token label, status code), thread-safe."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, label: str, code: int) -> None:
        with self._lock:
            self._counts[(label, str(code))] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def install(app: Flask) -> None:
    """Count every API request the app answers (after_request runs for the
    error answers too: 401, 403, 404, ...)."""
    counts = RequestCounts()
    app.extensions["jobdeck_api_requests"] = counts

    def count(response: Any) -> Any:
        if request.path.startswith(API_PREFIX) or request.endpoint in GUARDED_OUTSIDE_API:
            counts.add(g.get("jobdeck_caller", ANONYMOUS_LABEL), response.status_code)
        return response

    app.after_request(count)


def counts_of(app: Any) -> dict[tuple[str, str], int]:
    found: RequestCounts | None = app.extensions.get("jobdeck_api_requests")
    return found.snapshot() if found is not None else {}
