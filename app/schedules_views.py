"""The Schedules page (and its JSON twin under /api/schedules): each
schedule's cron in words, next run, last run with its job and outcome, the
recent outcomes, and Run now / Pause / Resume. Queue pause buttons live here
too, as the queue controls' page section.

Forms carry a CSRF token. When the dashboard has initialised flask-wtf's
``CSRFProtect`` it checks every POST; until then these views check the token
themselves, so the forms are never unprotected.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, abort, current_app, flash, jsonify, redirect, render_template, request, url_for
from flask_wtf.csrf import CSRFError, generate_csrf, validate_csrf
from werkzeug.routing import BuildError
from wtforms.validators import ValidationError

from app import api
from app.service import Jobdeck
from app.wiring import operations_of

bp = Blueprint("schedules", __name__)
api_bp = Blueprint("api_schedules", __name__, url_prefix="/api/schedules")
api_bp.before_request(api._authenticate)

# The dashboard's job page, whichever name it registers under; the API's job
# document otherwise.
JOB_ENDPOINTS = ("dashboard.job", "dashboard.job_detail", "views.job", "api.show")


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def job_url(job_id: int) -> str:
    for endpoint in JOB_ENDPOINTS:
        try:
            return url_for(endpoint, job_id=job_id)
        except BuildError:
            continue
    return "#"


@bp.context_processor
def _helpers() -> dict[str, Any]:
    return {"csrf_token": generate_csrf, "job_url": job_url}


def _check_csrf() -> None:
    if "csrf" in current_app.extensions:
        return  # CSRFProtect has checked it already
    try:
        validate_csrf(request.form.get("csrf_token"))
    except ValidationError as exc:
        raise CSRFError(str(exc)) from None


def _actor() -> str:
    from app.dashboard.auth import current_user

    user = current_user()
    return user.name if user is not None else "dashboard"


def _json_run(run: dict[str, Any]) -> dict[str, Any]:
    return {**run, "fire_time": run["fire_time"].isoformat()}


def _json(s: dict[str, Any]) -> dict[str, Any]:
    next_run: datetime | None = s["next_run"]
    return {**s, "next_run": next_run.isoformat() if next_run else None, "runs": [_json_run(r) for r in s["runs"]]}


# -- the page ---------------------------------------------------------------------


@bp.get("/schedules")
def index() -> Any:
    deck = _deck()
    ops = operations_of(deck)
    now = deck.clock()
    return render_template(
        "schedules.html", schedules=ops.periodic.overview(now), queues=ops.queues.list_queues(), now=now
    )


@bp.post("/schedules/<path:name>/<any(run, pause, resume):action>")
def act(name: str, action: str) -> Any:
    _check_csrf()
    deck = _deck()
    periodic = operations_of(deck).periodic
    if name not in periodic.schedules:
        abort(404, f"no schedule named {name!r} in the configuration")
    now = deck.clock()
    if action == "run":
        job = periodic.run_now(name, now, _actor())
        flash(f"{name}: enqueued job #{job.id}")
    else:
        periodic.set_paused(name, action == "pause", now, _actor())
        flash(f"{name}: {'paused' if action == 'pause' else 'resumed'}")
    return redirect(url_for("schedules.index"))


@bp.post("/queues/<path:name>/<any(pause, resume):action>")
def queue_act(name: str, action: str) -> Any:
    _check_csrf()
    deck = _deck()
    if not name or len(name) > 100:
        abort(400, "a queue name is 1 to 100 characters")
    operations_of(deck).queues.set_paused(name, action == "pause", deck.clock(), _actor())
    flash(f"queue {name}: {'paused' if action == 'pause' else 'resumed'}")
    return redirect(url_for("schedules.index"))


# -- JSON -------------------------------------------------------------------------


@api_bp.get("")
def api_index() -> Any:
    deck = _deck()
    return jsonify({"schedules": [_json(s) for s in operations_of(deck).periodic.overview(deck.clock())]})


@api_bp.post("/<path:name>/run")
def api_run(name: str) -> Any:
    from app.serialize import job_json

    deck = _deck()
    job = operations_of(deck).periodic.run_now(name, deck.clock(), "api")
    return jsonify(job_json(job, deck.clock())), 201


@api_bp.post("/<path:name>/pause")
def api_pause(name: str) -> Any:
    return _api_set_paused(name, True)


@api_bp.post("/<path:name>/resume")
def api_resume(name: str) -> Any:
    return _api_set_paused(name, False)


def _api_set_paused(name: str, paused: bool) -> Any:
    deck = _deck()
    periodic = operations_of(deck).periodic
    periodic.set_paused(name, paused, deck.clock(), "api")
    return jsonify(next(_json(s) for s in periodic.overview(deck.clock()) if s["name"] == name))
