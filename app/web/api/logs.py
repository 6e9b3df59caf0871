"""A job's log over HTTP (``ctx.log``; ``jobdeck.jobs.joblogs``).

    GET /api/jobs/<id>/logs?attempt=&after=&limit=   -> {"logs": [Line], "next_after": id | null}

and the lines an HTTP worker sends with its heartbeat
(``POST /api/jobs/<id>/heartbeat`` with ``"logs": [{level, message, at?}]``,
parsed by ``jobdeck.jobs.joblogs.parse_lines``). Same bearer token as the rest of ``/api``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request
from jobdeck.core.validation import INT64_MAX, parse_int
from jobdeck.deck import Jobdeck
from jobdeck.store.joblogs import lines_of
from jobdeck.web.api import jobs as api
from jobdeck.web.serialize import iso

bp = Blueprint("api_logs", __name__, url_prefix="/api/jobs")
bp.before_request(api._authenticate)

MAX_PAGE = 1000
"""The most lines one page of ``GET .../logs`` holds."""


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def _arg(name: str, low: int, high: int = INT64_MAX) -> int | None:
    raw = request.args.get(name)
    return None if raw is None or raw == "" else parse_int(raw, name, low, high)


@bp.get("/<int:job_id>/logs")
def job_logs(job_id: int) -> Any:
    deck = _deck()
    attempt = _arg("attempt", 1, 2**31 - 1)
    after = _arg("after", 0) or 0
    limit = _arg("limit", 1, MAX_PAGE) or MAX_PAGE
    deck.store.get(job_id)  # 404 for an unknown job
    lines = lines_of(deck.store, job_id, attempt=attempt, after=after, limit=limit + 1)
    more = len(lines) > limit
    lines = lines[:limit]
    return jsonify(
        {
            "logs": [{**line.to_dict(), "at": iso(line.at)} for line in lines],
            "next_after": lines[-1].id if more else None,
        }
    )
