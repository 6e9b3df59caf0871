"""Bulk enqueue over JSON: many jobs in one call and one transaction.

    POST /api/jobs/bulk   {jobs: [NewJob, ...]}
                          -> 201 {jobs: [{id, created, duplicate, replaced}, ...]} in the order given
                             (200 when no job was created: every one was there already)

Each job is checked as ``POST /api/jobs`` checks one and answered as one is
(``Jobdeck.enqueue_bulk``); one refused job refuses the call with the job's
own status and ``jobs[i].field`` (``ItemRefused``), nothing inserted. The
route is the ``api`` blueprint's, with its token check, cross-site refusal
and JSON-body rule. Its body may be larger than any other request's
(``max_bulk_bytes``): the view raises the request's limit before reading
it, and both servers let this one path's body through
(``jobdeck.web.body_limits``).
"""

from __future__ import annotations

import re
from typing import Any

from flask import current_app, jsonify, request
from jobdeck.core.errors import InvalidField, ItemRefused, JobdeckError
from jobdeck.core.validation import MAX_JSON_DEPTH
from jobdeck.deck import Jobdeck
from jobdeck.web.api import jobs as api
from jobdeck.web.body_limits import BULK_PATH, larger_bodies

bp = api.bp


_IN_A_JOB = re.compile(r"jobs\[(\d+)\](?:\.(.+))?", re.S)
"""A field that ``check_json`` names inside a job of the list."""


@bp.post("/jobs/bulk")
def enqueue_bulk() -> Any:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    request.max_content_length = larger_bodies(deck.config)[BULK_PATH]
    try:
        data = api._body(depth=MAX_JSON_DEPTH + 2)  # each job as deep as alone: below the body and the list
    except InvalidField as exc:
        raise _in_a_job(exc) from None
    unknown = sorted(set(data) - {"jobs"})
    if unknown:
        raise InvalidField(unknown[0], "unknown field; give jobs")
    items = data.get("jobs")
    if not isinstance(items, list):
        raise InvalidField("jobs", f"required, a list of 1 to {deck.config.max_bulk_jobs} jobs (max_bulk_jobs)")
    enqueued = deck.enqueue_bulk(items)
    return jsonify({"jobs": [e._asdict() for e in enqueued]}), 201 if any(e.created for e in enqueued) else 200


def _in_a_job(exc: InvalidField) -> JobdeckError:
    """A refusal of the body's JSON (depth, NaN, invalid Unicode) inside a
    job, as the job's: ``jobs[3].payload.x`` with ``index`` 3."""
    found = _IN_A_JOB.fullmatch(exc.field)
    if found is None:
        return exc
    reason = str(exc).removeprefix(f"{exc.field}: ")
    return ItemRefused(int(found[1]), InvalidField(found[2] or "body", reason))
