"""Creating, editing and deleting runtime schedules: the dashboard's forms
(``/schedules/new``, ``/schedules/<name>/edit``, ``/schedules/<name>/delete``)
and their JSON twin (``POST /api/schedules``, ``PUT`` and ``DELETE
/api/schedules/<name>``). Both call ``deck.runtime_schedules``, which
validates like the config file and writes the audit log.

The forms are plain posts (post/redirect/get), outside the Schedules page's
polled table, so a refresh never wipes what an operator is typing; refused
input comes back in the form with the reason (422).
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, abort, current_app, flash, jsonify, redirect, render_template, request, url_for
from jobdeck.core.errors import InvalidField, JobdeckError
from jobdeck.core.validation import loads
from jobdeck.deck import Jobdeck
from jobdeck.store.runtime_schedules import get_runtime_schedule
from jobdeck.web import guard
from jobdeck.web.api import jobs as api
from jobdeck.web.dashboard.auth import require_operator
from jobdeck.web.dashboard.schedules import _actor, _json

bp = Blueprint("schedule_edit", __name__)
api_bp = Blueprint("api_schedule_edit", __name__, url_prefix="/api/schedules")
api_bp.before_request(api._authenticate)
api_bp.before_request(api.require_json_body)

FORM_FIELDS = ("name", "cron", "timezone", "type", "payload", "queue", "priority", "max_retries", "misfire",
               "expect_success_within", "alert_after_failures")  # fmt: skip
MAX_FIELD_CHARS = 200


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def _shown(name: str) -> dict[str, Any]:
    deck = _deck()
    return _json(next(s for s in deck.schedules.overview(deck.clock(), recent=1) if s["name"] == name))


# -- JSON -------------------------------------------------------------------------


@api_bp.post("")
def api_create() -> Any:
    deck = _deck()
    schedule = deck.runtime_schedules.create(api._body(), guard.actor(), deck.clock())
    return jsonify(_shown(schedule.name)), 201


@api_bp.put("/<path:name>")
def api_update(name: str) -> Any:
    deck = _deck()
    deck.runtime_schedules.update(name, api._body(), guard.actor(), deck.clock())
    return jsonify(_shown(name))


@api_bp.delete("/<path:name>")
def api_delete(name: str) -> Any:
    deck = _deck()
    deck.runtime_schedules.delete(name, guard.actor(), deck.clock())
    return jsonify({"deleted": name})


# -- dashboard ----------------------------------------------------------------------


def entry_from_form(form: Any) -> dict[str, Any]:
    """A schedule entry from the form: empty fields left out, payload and
    numbers parsed; the entry is then validated like any other."""
    entry: dict[str, Any] = {}
    for key in FORM_FIELDS:
        raw = form.get(key, "")
        if key != "payload" and len(raw) > MAX_FIELD_CHARS:
            raise InvalidField(key, f"at most {MAX_FIELD_CHARS} characters")
        text = raw.strip() if key != "name" else raw
        if not text.strip():
            continue
        if key == "payload":
            try:
                entry[key] = loads(text, "payload")
            except ValueError:
                raise InvalidField("payload", 'not valid JSON (an object such as {"region": "emea"})') from None
        elif key in ("max_retries", "alert_after_failures", "priority") and text.lstrip("-").isdigit():
            entry[key] = int(text)
        elif key == "expect_success_within" and text.replace(".", "", 1).isdigit():
            entry[key] = float(text)
        else:
            entry[key] = text
    entry["enabled"] = form.get("enabled") == "on"
    return entry


def _form_page(name: str | None, values: dict[str, str], error: str | None = None, status: int = 200) -> Any:
    deck = _deck()
    html = render_template(
        "schedule_form.html", name=name, values=values, error=error, types=deck.type_names(),
    )  # fmt: skip
    return html, status


def _values(entry: dict[str, Any]) -> dict[str, str]:
    """A stored entry as the form's text fields."""
    out = {k: ("" if v is None else json.dumps(v, indent=2) if k == "payload" else str(v)) for k, v in entry.items()}
    out["enabled"] = "on" if entry.get("enabled", True) else ""
    return out


@bp.get("/schedules/new")
@require_operator
def new() -> Any:
    return _form_page(None, {"timezone": "UTC", "payload": "{}", "enabled": "on"})


@bp.post("/schedules/new")
@require_operator
def create() -> Any:
    deck = _deck()
    typed = {k: request.form.get(k, "") for k in (*FORM_FIELDS, "enabled")}
    try:
        schedule = deck.runtime_schedules.create(entry_from_form(request.form), _actor(), deck.clock())
    except JobdeckError as exc:
        return _form_page(None, typed, str(exc), exc.status_code if exc.status_code != 400 else 422)
    flash(f"{schedule.name}: created; it fires {schedule.describe()}", "success")
    return redirect(url_for("schedules.index"), code=303)


@bp.get("/schedules/<path:name>/edit")
@require_operator
def edit(name: str) -> Any:
    deck = _deck()
    if name in deck.schedules.configured:
        abort(409, f"schedule {name!r} comes from the configuration file: change it there")
    stored = get_runtime_schedule(deck.store, name)
    if stored is None:
        abort(404, f"no runtime schedule named {name!r}")
    return _form_page(name, _values(stored.definition))


@bp.post("/schedules/<path:name>/edit")
@require_operator
def update(name: str) -> Any:
    deck = _deck()
    typed = {k: request.form.get(k, "") for k in (*FORM_FIELDS, "enabled")}
    typed["name"] = name
    try:
        entry = entry_from_form(request.form)
        entry["name"] = name
        schedule = deck.runtime_schedules.update(name, entry, _actor(), deck.clock())
    except JobdeckError as exc:
        return _form_page(name, typed, str(exc), exc.status_code if exc.status_code != 400 else 422)
    flash(f"{name}: saved; it fires {schedule.describe()}", "success")
    return redirect(url_for("schedules.index"), code=303)


@bp.post("/schedules/<path:name>/delete")
@require_operator
def delete(name: str) -> Any:
    deck = _deck()
    try:
        deck.runtime_schedules.delete(name, _actor(), deck.clock())
    except JobdeckError as exc:
        flash(str(exc), "error")
        return redirect(url_for("schedules.index"), code=303)
    flash(f"{name}: deleted; its past runs stay listed", "success")
    return redirect(url_for("schedules.index"), code=303)
