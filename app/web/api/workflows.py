"""Workflows and batches over JSON (``jobdeck.jobs.workflows`` builds and checks them).

    POST /api/workflows                 {name, jobs: [{name, type, payload, depends_on, ...}],
                                         on_dependency_failure, key}
                                        -> 201 {id, name, jobs: {step: job id}, created: true}
                                           (200, created false: ``key`` named an existing workflow)
    GET  /api/workflows                 ?limit&before&name -> {workflows, next_before}, newest first
    GET  /api/workflows/<id>            -> the workflow, its jobs and its edges
    POST /api/workflows/<id>/retry      -> {moved: [job ids], workflow}: its failed, dead and discarded jobs
    POST /api/workflows/<id>/cancel     -> {moved: [job ids], workflow}: every job a cancel applies to
    POST /api/batches                   {name, on_complete, on_success, on_dead} -> 201 the batch
    POST /api/batches/<id>/jobs         {jobs: [NewJob]} -> 201 {ids}; 409 once closed
    POST /api/batches/<id>/close        -> the batch; 409 if closed already
    GET  /api/batches                   ?limit&before -> {batches, next_before}, newest first
    GET  /api/batches/<id>              -> the batch: state, counts, fired_at, outcome

These are routes of the ``api`` blueprint (``jobdeck.web.api.jobs``), added
when this package is imported: its token check, cross-site refusal, JSON-body
rule and CSRF exemption are theirs. Retry and cancel are recorded in the
audit log as done by the token (``token:NAME``, or ``api``), like a job's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import current_app, jsonify, request
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import Transition
from jobdeck.core.validation import INT64_MAX, check_text, parse_int
from jobdeck.deck import Jobdeck
from jobdeck.jobs.workflows import MAX_NAME_CHARS, REFUSED_OPTIONS, act_on_workflow, max_jobs
from jobdeck.store.graph import CALLBACKS
from jobdeck.store.records import NewJob
from jobdeck.web import guard
from jobdeck.web.api import jobs as api
from jobdeck.web.serialize import batch_json, workflow_graph_json, workflow_json

bp = api.bp

MAX_PAGE = 200
_BATCH_FIELDS = frozenset({"name", *CALLBACKS})


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


@bp.post("/workflows")
def enqueue_workflow() -> Any:
    """Check the whole graph first (``parse_workflow``): a cycle, an unknown
    name, too many jobs or any bad field is a 422 naming it, with nothing
    inserted; then one transaction inserts it all."""
    deck = _deck()
    enqueued = deck.enqueue_workflow(api._body())
    answer = {"id": enqueued.id, "name": enqueued.name, "jobs": enqueued.jobs, "created": enqueued.created}
    return jsonify(answer), 201 if enqueued.created else 200


@bp.get("/workflows")
def list_workflows() -> Any:
    deck = _deck()
    limit = _limit()
    name = request.args.get("name") or None
    if name is not None:
        check_text(name, "name", MAX_NAME_CHARS)
    found = deck.store.list_workflows(limit=limit + 1, before=_before(), name=name)
    page = found[:limit]
    return jsonify(
        {"workflows": [workflow_json(w) for w in page], "next_before": page[-1].id if len(found) > limit else None}
    )


@bp.get("/workflows/<int:workflow_id>")
def show_workflow(workflow_id: int) -> Any:
    deck = _deck()
    return jsonify(workflow_graph_json(deck.store.workflow(workflow_id), deck.clock()))


@bp.post("/workflows/<int:workflow_id>/retry")
def retry_workflow(workflow_id: int) -> Any:
    """Retry the failed part; dependents held by ``hold`` run once it completes."""
    deck = _deck()
    api._body()
    moved = act_on_workflow(deck, workflow_id, Transition.RETRY, guard.actor(), "retry")
    return _moved(deck, workflow_id, moved)


@bp.post("/workflows/<int:workflow_id>/cancel")
def cancel_workflow(workflow_id: int) -> Any:
    """Cancel the rest: blocked, pending and failed jobs at once, running ones
    cooperatively (they end cancelled when their attempt ends)."""
    deck = _deck()
    api._body()
    moved = act_on_workflow(deck, workflow_id, Transition.CANCEL, guard.actor(), "cancel")
    return _moved(deck, workflow_id, moved)


def _moved(deck: Jobdeck, workflow_id: int, moved: list[int]) -> Any:
    """The ids in id order (PostgreSQL's RETURNING has none), and the workflow now."""
    return jsonify({"moved": sorted(moved), "workflow": workflow_json(deck.store.workflow(workflow_id).workflow)})


@bp.post("/batches")
def open_batch() -> Any:
    """Open a batch; each callback is a job type or ``{type, payload, queue,
    priority, max_retries}``, checked now (422), enqueued when it fires."""
    deck = _deck()
    data = api._body()
    unknown = sorted(set(data) - _BATCH_FIELDS)
    if unknown:
        raise InvalidField(unknown[0], f"unknown field; a batch takes {', '.join(sorted(_BATCH_FIELDS))}")
    batch = deck.batch(name=data.get("name"), **{k: data.get(k) for k in CALLBACKS})
    return jsonify(batch_json(deck.store.batch(batch.id))), 201


@bp.post("/batches/<int:batch_id>/jobs")
def add_to_batch(batch_id: int) -> Any:
    """Enqueue jobs into an open batch in one transaction, each checked as
    ``POST /api/jobs`` checks one (422 naming ``jobs[i].field``, nothing
    inserted); 409 once the batch is closed."""
    deck = _deck()
    data = api._body()
    unknown = sorted(set(data) - {"jobs"})
    if unknown:
        raise InvalidField(unknown[0], "unknown field; give jobs")
    items = data.get("jobs")
    limit = max_jobs(deck)
    if not isinstance(items, list) or not items or len(items) > limit:
        raise InvalidField("jobs", f"required, a list of 1 to {limit} jobs per request ([workflows] max_jobs)")
    now = deck.clock()
    news = [_batch_job(deck, item, f"jobs[{i}]", now) for i, item in enumerate(items)]
    return jsonify({"ids": deck.store.add_to_batch(batch_id, news, now)}), 201


def _batch_job(deck: Jobdeck, item: Any, where: str, now: Any) -> NewJob:
    if not isinstance(item, Mapping):
        raise InvalidField(where, "expected a JSON object")
    for refused in REFUSED_OPTIONS:
        if refused in item:
            raise InvalidField(f"{where}.{refused}", "not allowed in a batch")
    try:
        return deck.new_job(item, now)
    except InvalidField as exc:
        raise InvalidField(f"{where}.{exc.field}", str(exc).split(": ", 1)[-1]) from None


@bp.post("/batches/<int:batch_id>/close")
def close_batch(batch_id: int) -> Any:
    """No more jobs: the end of its last job fires the callbacks, or this
    close does when every job has ended already."""
    deck = _deck()
    api._body()
    return jsonify(batch_json(deck.store.close_batch(batch_id, deck.clock())))


@bp.get("/batches")
def list_batches() -> Any:
    deck = _deck()
    limit = _limit()
    found = deck.store.list_batches(limit=limit + 1, before=_before())
    page = found[:limit]
    return jsonify(
        {"batches": [batch_json(b) for b in page], "next_before": page[-1].id if len(found) > limit else None}
    )


@bp.get("/batches/<int:batch_id>")
def show_batch(batch_id: int) -> Any:
    return jsonify(batch_json(_deck().store.batch(batch_id)))


def _limit() -> int:
    raw = request.args.get("limit")
    return 50 if not raw else parse_int(raw, "limit", 1, MAX_PAGE)


def _before() -> int | None:
    raw = request.args.get("before")
    return None if not raw else parse_int(raw, "before", 1, INT64_MAX)
