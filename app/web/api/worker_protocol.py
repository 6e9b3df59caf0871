"""The external-worker protocol of the JSON API: what a worker in any
language calls to run jobs over HTTP.

    POST /api/jobs/claim                 {worker_id, types?, queues?, limit?} -> the jobs it now holds
    POST /api/jobs/<id>/heartbeat        {worker_id, logs?}   -> the job, and ``cancel`` when asked to stop
    POST /api/jobs/<id>/complete         {worker_id, result?, logs?}
    POST /api/jobs/<id>/fail             {worker_id, error, retryable?, traceback?, logs?}
    POST /api/jobs/<id>/snooze           {worker_id, seconds, reason?, logs?}
    POST /api/jobs/<id>/release          {worker_id, attempt}

Each outcome is fenced by job, attempt and worker in the store, as the
pool's own are. The routes are the ``api`` blueprint's
(``jobdeck.web.api.jobs``), with its token check, cross-site refusal and
JSON-body rule; the effects ledger's steps are in ``jobdeck.web.api.effects``.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from flask import jsonify
from jobdeck.core.errors import InvalidField, TransitionRefused
from jobdeck.core.validation import check_result_size, check_text
from jobdeck.deck import Jobdeck
from jobdeck.jobs.joblogs import parse_lines
from jobdeck.jobs.snooze import MAX_REASON_CHARS, InvalidSnooze, check_seconds, max_snoozes
from jobdeck.store.joblogs import append_lines
from jobdeck.web import guard
from jobdeck.web.api import jobs as api
from jobdeck.web.serialize import job_json

bp = api.bp


MAX_ERROR_CHARS = 65536
"""A failure's message or traceback as an external worker reports it."""


def _str_list(data: dict[str, Any], field: str) -> list[str] | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidField(field, "must be a list of strings")
    if not value or len(value) > 1000:
        raise InvalidField(field, "1 to 1000 names; leave it out to claim from all")
    return [check_text(v, field, 200) for v in value]


@bp.post("/jobs/claim")
def claim() -> Any:
    deck = api._deck()
    data = api._body()
    worker_id = api._worker_id(data)
    types = _str_list(data, "types")
    queues = _str_list(data, "queues")
    caller = guard.principal()
    if caller is not None:
        types, queues = caller.claim_filter(types, queues)
    limit = data.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100):
        raise InvalidField("limit", "must be an integer from 1 to 100")
    now = deck.clock()
    jobs = deck.store.claim(worker_id, now, limit=limit or 1, types=types, queues=queues)
    if limit is None:
        return jsonify(job_json(jobs[0], now) if jobs else None)
    return jsonify([job_json(j, now) for j in jobs])


@bp.post("/jobs/<int:job_id>/heartbeat")
def heartbeat(job_id: int) -> Any:
    """Beat for a held job; ``logs`` (optional) carries the lines the
    worker logged since its last beat, kept in the attempt's log under the
    same caps as ``ctx.log`` (``logs_kept`` says how many fitted)."""
    deck = api._deck()
    data = api._body()
    worker_id = api._worker_id(data)
    now = deck.clock()
    lines = parse_lines(data["logs"], now) if data.get("logs") is not None else None
    job = deck.store.heartbeat(job_id, worker_id, now)
    # The worker's cue to stop: the job was cancelled while it ran.
    answer = {**job_json(job, now), "cancel": job.cancel_requested_at is not None}
    if lines is not None:
        answer["logs_kept"] = append_lines(deck.store, job_id, job.attempt, lines, 0, deck.log_limits) if lines else 0
    return jsonify(answer)


def _last_lines(deck: Jobdeck, job_id: int, worker_id: str, data: dict[str, Any], now: Any) -> None:
    """``logs`` sent with complete, fail or snooze: the attempt's last
    lines, kept before the outcome (the beat checks the worker still holds
    the job). When it does not, the lines are dropped and the outcome's own
    call refuses in its own words ("only running jobs can be completed")."""
    if data.get("logs") is None:
        return
    lines = parse_lines(data["logs"], now)
    try:
        job = deck.store.heartbeat(job_id, worker_id, now)
    except TransitionRefused:
        return
    if lines:
        append_lines(deck.store, job_id, job.attempt, lines, 0, deck.log_limits)


@bp.post("/jobs/<int:job_id>/complete")
def complete(job_id: int) -> Any:
    deck = api._deck()
    data = api._body()
    now = deck.clock()
    worker_id = api._worker_id(data)
    result = data.get("result")
    if result is not None:
        check_result_size(json.dumps(result, ensure_ascii=False, separators=(",", ":")), deck.config.max_result_bytes)
    _last_lines(deck, job_id, worker_id, data, now)
    with _acknowledged(deck, job_id, "complete"):
        job = deck.store.complete(job_id, worker_id, now, result=result)
    return jsonify(job_json(job, now))


@bp.post("/jobs/<int:job_id>/fail")
def fail(job_id: int) -> Any:
    deck = api._deck()
    data = api._body()
    worker_id = api._worker_id(data)
    error = data.get("error")
    if not isinstance(error, str) or not error:
        raise InvalidField("error", "required, a non-empty string")
    check_text(error, "error", MAX_ERROR_CHARS)
    retryable = data.get("retryable", True)
    if not isinstance(retryable, bool):
        raise InvalidField("retryable", "must be true or false")
    tb = data.get("traceback")
    if tb is not None and not isinstance(tb, str):
        raise InvalidField("traceback", "must be a string")
    if tb is not None:
        check_text(tb, "traceback", 10 * MAX_ERROR_CHARS)
    now = deck.clock()
    _last_lines(deck, job_id, worker_id, data, now)
    with _acknowledged(deck, job_id, "fail"):
        job = deck.store.fail(job_id, worker_id, error, now, retryable=retryable, traceback=tb)
    return jsonify(job_json(job, now))


@bp.post("/jobs/<int:job_id>/snooze")
def snooze(job_id: int) -> Any:
    """Run the job again ``seconds`` from now, no retry counted (``jobdeck.jobs.snooze``);
    ``logs`` (optional) carries the attempt's last lines, as with complete."""
    deck = api._deck()
    data = api._body()
    worker_id = api._worker_id(data)
    try:
        seconds = check_seconds(data.get("seconds"))
    except InvalidSnooze as bad:
        raise InvalidField("seconds", str(bad)) from None
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidField("reason", "must be a string")
    if reason is not None:
        check_text(reason, "reason", MAX_REASON_CHARS)
    now = deck.clock()
    _last_lines(deck, job_id, worker_id, data, now)
    job_type = deck.store.get(job_id).type
    cap = max_snoozes(deck.config, deck.registry, job_type)
    with _acknowledged(deck, job_id, "snooze"):
        job = deck.store.snooze(job_id, worker_id, seconds, now, reason=reason, max_snoozes=cap)
    return jsonify(job_json(job, now))


@bp.post("/jobs/<int:job_id>/release")
def release(job_id: int) -> Any:
    """Give a claimed job back at shutdown: ``pending`` at once, no retry
    counted, the attempt recorded ``interrupted`` (the pool's release,
    ``Store.release``). Fenced by job, ``attempt`` and worker: a late or
    foreign release is refused (409) as a late complete is."""
    deck = api._deck()
    data = api._body()
    worker_id = api._worker_id(data)
    attempt = api._attempt(data)
    now = deck.clock()
    with _acknowledged(deck, job_id, "release"):
        job = deck.store.release_held(job_id, attempt, worker_id, now)
    return jsonify(job_json(job, now))


def _acknowledged(deck: Jobdeck, job_id: int, outcome: str) -> AbstractContextManager[None]:
    """With tracing on, a worker's report in its trace (``AttemptTracer.acknowledgement``)."""
    return deck.tracing.acknowledgement(job_id, outcome) if deck.tracing is not None else nullcontext()
