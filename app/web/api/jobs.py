"""The HTTP JSON API under /api: the ``api`` blueprint and what its routes
share (authentication, the JSON body, the worker id), then enqueue, reads,
stats and operator actions. The external-worker protocol (claim, heartbeat,
complete, fail, snooze, release) is ``jobdeck.web.api.worker_protocol``."""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, current_app, jsonify, request, url_for
from jobdeck import actions
from jobdeck.core.errors import InvalidField, JobdeckError
from jobdeck.core.states import State
from jobdeck.core.validation import (
    INT64_MAX,
    MAX_JSON_DEPTH,
    MAX_QUEUE_CHARS,
    MAX_SEARCH_CHARS,
    MAX_TYPE_CHARS,
    check_text,
    loads,
    parse_int,
    parse_time,
)
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter
from jobdeck.store.joblogs import count_lines
from jobdeck.store.lifecycle import Seen
from jobdeck.store.listing import list_within
from jobdeck.store.upkeep import HEALTH_WINDOWS, type_health
from jobdeck.web import guard
from jobdeck.web.guard import authenticate
from jobdeck.web.serialize import enqueue_waiting, iso, job_json

bp = Blueprint("api", __name__, url_prefix="/api")

MAX_WORKER_ID = 200
"""The ``worker_id`` column; a named token's prefix counts in it."""


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


@bp.before_request
def _authenticate() -> Any:
    """Token, session role, and the cross-site refusal: ``jobdeck.web.guard``.
    The queues and schedules blueprints install this same function."""
    return authenticate()


def require_json_body() -> None:
    """before_request of every API blueprint: a request that carries a body
    must say it is JSON (415 otherwise). A cross-site HTML form or a no-cors
    ``fetch`` can send only ``text/plain``, form or multipart bodies without
    a preflight, so this keeps a stranger's page from driving the API."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    has_body = bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if has_body and not request.is_json:
        raise UnsupportedMediaType(request.mimetype)


bp.before_request(require_json_body)


def _body(depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The request's JSON object: 400 if malformed, 422 if not an object or
    not acceptable JSON (``jobdeck.core.validation.loads``: depth, finite numbers,
    valid Unicode)."""
    data_bytes = request.get_data(cache=True)
    if not data_bytes:
        return {}
    try:
        data = loads(data_bytes, depth=depth)
    except ValueError:
        raise MalformedJSON() from None
    if not isinstance(data, dict):
        raise InvalidField("body", "expected a JSON object")
    return data


class MalformedJSON(JobdeckError):
    status_code = 400

    def __init__(self) -> None:
        super().__init__("malformed JSON in request body")


class UnsupportedMediaType(JobdeckError):
    status_code = 415

    def __init__(self, mimetype: str) -> None:
        super().__init__(f"request body must be application/json, got {mimetype or 'no Content-Type'!r}")


def _worker_id(data: dict[str, Any]) -> str:
    """The worker id the request works under: as given, or with a named
    token ``NAME/given`` (``jobdeck.web.tokens``), so its attempts name the
    token and no other token can act for it."""
    worker_id = data.get("worker_id")
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidField("worker_id", f"required, a string of at most {MAX_WORKER_ID} characters")
    return guard.worker_id(check_text(worker_id, "worker_id", MAX_WORKER_ID), MAX_WORKER_ID)


MAX_ATTEMPT = 2**31 - 1
"""The attempt column's integer."""


def _attempt(data: dict[str, Any]) -> int:
    """The attempt a worker's step or release is for: the number its claim answered."""
    attempt = data.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_ATTEMPT:
        raise InvalidField("attempt", "required: the attempt number the claim answered, an integer from 1")
    return attempt


@bp.get("/health")
def health() -> Any:
    """200 ``{"ok": true}`` while this process is healthy; 503 with the
    reasons when it needs a restart or its database writes fail (a full
    disk, read-only storage, an outage: ``deck.health``), so a load
    balancer or supervisor can take it out of service until they pass."""
    reasons = _deck().health.problems()
    if not reasons:
        return jsonify({"ok": True})
    return jsonify({"ok": False, "error": "; ".join(reasons), "reasons": reasons}), 503


@bp.post("/jobs")
def enqueue() -> Any:
    deck = _deck()
    now = deck.clock()
    new = deck.new_job(_body(), now)
    enqueued = deck.store.enqueue(new, now, read_holders=True)
    enqueue_waiting(deck.clock(), enqueued.holders)
    data = job_json(enqueued.job, now)
    if enqueued.duplicate:
        data.update(duplicate=True, replaced=enqueued.changed)
    return _job_response(data, 201 if enqueued.created else 200)


_JOB_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""What ``jsonify`` writes, built once: ``jsonify`` builds an encoder per
call, which the enqueue endpoint, the API's busiest, need not pay for."""


def _job_response(data: dict[str, Any], status: int) -> Any:
    return current_app.response_class(_JOB_ENCODER.encode(data) + "\n", status=status, mimetype="application/json")


@bp.get("/jobs/<int:job_id>")
def show(job_id: int) -> Any:
    deck = _deck()
    job = deck.store.get(job_id)
    shown = job_json(job, deck.clock(), deck.store.attempts_of(job_id))
    lines = sum(count_lines(deck.store, job_id).values())
    shown["logs"] = {"lines": lines, "url": url_for("api_logs.job_logs", job_id=job_id)}
    return jsonify(shown)


@bp.patch("/jobs/<int:job_id>")
def edit(job_id: int) -> Any:
    """Edit a pending, scheduled or failed job (it keeps its state) or a
    dead one (edited and retried): any of payload, priority, queue, run_at.
    With ``updated_at`` (as read from the job) the edit is refused with 409
    if the job changed since; without it, if it changes during the call."""
    deck = _deck()
    data = _body()
    seen_at = data.pop("updated_at", None)
    if not data:
        raise InvalidField("body", "give at least one of payload, priority, queue, run_at")
    seen = None
    job = deck.store.get(job_id) if seen_at is not None or data.get("payload") is not None else None
    if seen_at is not None and job is not None:
        seen = Seen(job.status, job.attempt, parse_time(seen_at, "updated_at"))
    now = deck.clock()
    changes = deck.job_changes(data, job.type if job is not None else None)  # a typed payload is checked too
    edited = actions.edit(deck.store, job_id, changes, guard.actor(), now, seen)
    return jsonify(job_json(edited.after, now))


@bp.get("/jobs")
def index() -> Any:
    deck = _deck()
    args = request.args
    status = args.get("status") or None
    if status is not None and status not in {s.value for s in State}:
        raise InvalidField("status", f"unknown status {status[:40]!r}; one of {', '.join(s.value for s in State)}")
    limit = _int_arg("limit", 50, 1, 500)
    cursor = _int_arg("cursor", None, 1, None)
    f = JobFilter(
        status=State(status) if status else None,
        type=_text_arg("type", MAX_TYPE_CHARS),
        queue=_text_arg("queue", MAX_QUEUE_CHARS),
        search=_text_arg("q", MAX_SEARCH_CHARS),
        before_id=cursor,
        limit=limit + 1,
    )
    now = deck.clock()
    jobs, cut = list_within(deck.store, f, now, deck.config.max_list_bytes)
    more = cut or len(jobs) > limit
    jobs = jobs[:limit]
    return jsonify({"jobs": [job_json(j, now) for j in jobs], "next_cursor": jobs[-1].id if more else None})


def _int_arg(name: str, default: int | None, low: int, high: int | None) -> Any:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    return parse_int(raw, name, low, INT64_MAX if high is None else high)


def _text_arg(name: str, max_length: int) -> str | None:
    raw = request.args.get(name)
    return check_text(raw, name, max_length) if raw else None


@bp.get("/stats")
def stats() -> Any:
    deck = _deck()
    return jsonify({"counts": deck.store.counts(deck.clock())})


@bp.get("/stats/types")
def type_stats() -> Any:
    """Each job type's health over the last hour and day, from the
    per-minute counters (``jobdeck.store.upkeep.type_health``)."""
    deck = _deck()
    now = deck.clock()
    windows = [
        {
            "window": label,
            "seconds": int(window.total_seconds()),
            "types": [
                {"type": h.type, "completed": h.completed, "failed": h.failed, "dead": h.dead,
                 "failure_rate": h.failure_rate, "p50_seconds": h.p50, "p95_seconds": h.p95}
                for h in type_health(deck.store, now, window)
            ],
        }
        for label, window in HEALTH_WINDOWS
    ]  # fmt: skip
    return jsonify({"windows": windows})


@bp.post("/jobs/<int:job_id>/retry")
def retry(job_id: int) -> Any:
    return _operator_action(job_id, "retry")


@bp.post("/jobs/<int:job_id>/discard")
def discard(job_id: int) -> Any:
    return _operator_action(job_id, "discard")


@bp.post("/jobs/<int:job_id>/cancel")
def cancel(job_id: int) -> Any:
    """200 with the job cancelled; 202 with a running job still running, its
    cancel requested (it ends cancelled when its attempt ends); 409 refused."""
    deck = _deck()
    _body()
    now = deck.clock()
    job = actions.cancel(deck.store, job_id, guard.actor(), now)
    if job.status is State.RUNNING:
        return jsonify(
            {**job_json(job, now), "cancel_requested": True, "cancel_requested_at": iso(job.cancel_requested_at)}
        ), 202
    return jsonify(job_json(job, now))


def _operator_action(job_id: int, action: str) -> Any:
    """Retry or discard one job, recorded in the audit log as done by the
    token (``token:NAME``, or ``api``: ``guard.actor``) (a refusal too, as from the dashboard and the CLI: ``jobdeck.actions``)."""
    deck = _deck()
    _body()
    now = deck.clock()
    job = (actions.retry if action == "retry" else actions.discard)(deck.store, job_id, guard.actor(), now)
    return jsonify(job_json(job, now))
