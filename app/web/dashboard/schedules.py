"""The Schedules and Queues pages (and the schedules' JSON twin under
/api/schedules).

Schedules: each schedule's source (config or runtime, the runtime ones
edited in ``schedule_edit``), its health (``jobdeck.maintenance.schedule_health``), its cron in words, next run, last run with its job and
outcome, the last successful run's artifacts (the nightly report, one click
away), the recent outcomes at a glance, and Run now / Pause / Resume.
Queues: each queue's waiting and running jobs, paused state and concurrency
limit, the per-type limits, and Pause / Resume.

Both pages refresh their table on the dashboard's ``jd-poll`` event; the
actions are htmx POSTs answered with the refreshed table and a flash message
(post/redirect/get without JavaScript), for operators only, each recorded in
the audit log by the operation itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, abort, current_app, flash, jsonify, redirect, render_template, url_for
from jobdeck.core.validation import MAX_QUEUE_CHARS, check_text
from jobdeck.deck import Jobdeck
from jobdeck.store import JobRecord
from jobdeck.store.artifacts import last_completed_artifacts
from jobdeck.store.reads import running_by_type
from jobdeck.store.upkeep import HEALTH_WINDOWS, type_health
from jobdeck.web import guard
from jobdeck.web.api import jobs as api
from jobdeck.web.dashboard.auth import current_user, require_operator
from jobdeck.web.dashboard.replies import flash_response, is_htmx
from jobdeck.web.dashboard.tabs import BY_SLUG
from jobdeck.web.serialize import iso
from markupsafe import Markup

bp = Blueprint("schedules", __name__)
api_bp = Blueprint("api_schedules", __name__, url_prefix="/api/schedules")
api_bp.before_request(api._authenticate)
api_bp.before_request(api.require_json_body)

OUTCOME_LABELS = {slug: tab.label for slug, tab in BY_SLUG.items()} | {"pruned": "pruned by retention"}
"""A run's job status in the dashboard's words (``dead`` is "Dead letter")."""


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def _actor() -> str:
    user = current_user()
    return user.name if user is not None else "dashboard"


def _json_run(run: dict[str, Any]) -> dict[str, Any]:
    return {**run, "fire_time": iso(run["fire_time"])}


def _json(s: dict[str, Any]) -> dict[str, Any]:
    """A schedule for the API, its times in ``iso`` like a job's."""
    health = {k: iso(v) if isinstance(v, datetime) else v for k, v in s["health"].items()}
    return {**s, "next_run": iso(s["next_run"]), "runs": [_json_run(r) for r in s["runs"]], "health": health}


def _answer(page: str, template: str, context: dict[str, Any], message: str, kind: str = "success") -> Any:
    """htmx: the refreshed table in place plus the message; otherwise
    flash it and redirect to the page (post/redirect/get)."""
    if not is_htmx():
        flash(message, kind)
        return redirect(url_for(page), code=303)
    return flash_response(message, kind, body=render_template(template, **context))


# -- schedules --------------------------------------------------------------------


def _schedules() -> dict[str, Any]:
    deck = _deck()
    now = deck.clock()
    overview = deck.schedules.overview(now)
    reports = last_completed_artifacts(deck.store, [s["name"] for s in overview])
    return {"schedules": overview, "now": now, "outcome_labels": OUTCOME_LABELS, "reports": reports}


@bp.get("/schedules")
def index() -> Any:
    return render_template("schedules.html", **_schedules())


@bp.get("/fragments/schedules")
def schedules_live() -> Any:
    return render_template("_schedules_live.html", **_schedules())


@bp.post("/schedules/<path:name>/<any(run, pause, resume):action>")
@require_operator
def act(name: str, action: str) -> Any:
    deck = _deck()
    schedules = deck.schedules
    if name not in schedules.all():
        abort(404, f"no schedule named {name!r}")
    now = deck.clock()
    if action == "run":
        message: str = _started(name, schedules.run_now(name, now, _actor()))
    else:
        schedules.set_paused(name, action == "pause", now, _actor())
        message = f"{name}: {'paused' if action == 'pause' else 'resumed'}"
    return _answer("schedules.index", "_schedules_live.html", _schedules(), message)


def _started(name: str, job: JobRecord) -> Markup:
    """Run now's message, a link to what it started: the job, or for a
    workflow schedule the workflow (``run_now`` answers with its first job,
    whose number named a job the operator never asked for)."""
    if job.workflow_id is None:
        href = url_for("dashboard.job", job_id=job.id)
        return Markup('<bdi>{}</bdi>: enqueued <a href="{}">job #{}</a>').format(name, href, job.id)
    href = url_for("workflows.workflow", workflow_id=job.workflow_id)
    return Markup('<bdi>{}</bdi>: started workflow <a href="{}"><bdi>{}</bdi> #{}</a>').format(
        name, href, _deck().schedules.get(name).workflow, job.workflow_id
    )


# -- queues -------------------------------------------------------------------------


def _queues() -> dict[str, Any]:
    deck = _deck()
    controls = deck.queues
    type_limits = controls.limits.types
    running = running_by_type(deck.store, list(type_limits))
    now = deck.clock()
    return {
        "queues": controls.list_queues(now),
        "flow_limits": controls.flow_limits(now) if controls.flow else [],
        "type_limits": [(t, running.get(t, 0), n) for t, n in sorted(type_limits.items())],
        "now": now,
        "type_health": [(label, type_health(deck.store, now, window)) for label, window in HEALTH_WINDOWS],
    }


@bp.get("/queues")
def queues() -> Any:
    return render_template("queues.html", **_queues())


@bp.get("/fragments/queues")
def queues_live() -> Any:
    return render_template("_queues_live.html", **_queues())


@bp.post("/queues/<path:name>/<any(pause, resume):action>")
@require_operator
def queue_act(name: str, action: str) -> Any:
    deck = _deck()
    if not name:
        abort(400, "a queue name is 1 to 100 characters")
    check_text(name, "queue", MAX_QUEUE_CHARS)
    deck.queues.set_paused(name, action == "pause", deck.clock(), _actor())
    message = f"queue {name}: {'paused: no new jobs start, running ones finish' if action == 'pause' else 'resumed'}"
    return _answer("schedules.queues", "_queues_live.html", _queues(), message)


# -- JSON -------------------------------------------------------------------------


@api_bp.get("")
def api_index() -> Any:
    deck = _deck()
    return jsonify({"schedules": [_json(s) for s in deck.schedules.overview(deck.clock())]})


@api_bp.post("/<path:name>/run")
def api_run(name: str) -> Any:
    from jobdeck.web.serialize import job_json

    deck = _deck()
    job = deck.schedules.run_now(name, deck.clock(), guard.actor())
    return jsonify(job_json(job, deck.clock())), 201


@api_bp.post("/<path:name>/pause")
def api_pause(name: str) -> Any:
    return _api_set_paused(name, True)


@api_bp.post("/<path:name>/resume")
def api_resume(name: str) -> Any:
    return _api_set_paused(name, False)


def _api_set_paused(name: str, paused: bool) -> Any:
    deck = _deck()
    schedules = deck.schedules
    schedules.set_paused(name, paused, deck.clock(), guard.actor())
    return jsonify(next(_json(s) for s in schedules.overview(deck.clock()) if s["name"] == name))
