"""The effects ledger over JSON: a job's effects, and a person's word on an
unknown one.

    GET  /api/jobs/<id>/effects                 -> {"effects": [Effect]}
    POST /api/jobs/<id>/effects/<key>/resolve   {"outcome": "done" | "not_performed", "result": ...}
                                                -> the effect; then retry the job

Same bearer token and body rules as the rest of ``/api``; each resolve is
recorded in the audit log as done by the token (``token:NAME``, or ``api``),
like the API's retry.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from jobdeck import actions
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import EFFECT_RESOLUTIONS, EffectState
from jobdeck.deck import Jobdeck
from jobdeck.web import guard
from jobdeck.web.api import jobs as api

bp = Blueprint("api_effects", __name__, url_prefix="/api/jobs")
bp.before_request(api._authenticate)

OUTCOMES = {s.value: s for s in EFFECT_RESOLUTIONS}
MAX_KEY = 255
"""The ledger's key column: a longer key cannot name an effect."""


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def _job(deck: Jobdeck, job_id: int) -> None:
    """404 for an unknown job (an id no BIGINT holds matches no route: the
    app's id converter refuses it)."""
    deck.store.get(job_id)


@bp.get("/<int:job_id>/effects")
def effects_of(job_id: int) -> Any:
    deck = _deck()
    _job(deck, job_id)
    return jsonify({"effects": [e.to_dict() for e in deck.store.ledger.of_job(job_id)]})


@bp.post("/<int:job_id>/effects/<path:key>/resolve")
def resolve(job_id: int, key: str) -> Any:
    """Mark an unknown (started) effect done or not performed (409 for any
    other state): the job's next attempt then skips it, returning
    ``result``, or performs it."""
    deck = _deck()
    data = api._body()
    if "\x00" in key or len(key) > MAX_KEY:
        raise InvalidField("key", f"at most {MAX_KEY} characters, without NUL")
    raw = data.get("outcome")
    outcome = OUTCOMES.get(raw) if isinstance(raw, str) else None
    if outcome is None:
        raise InvalidField("outcome", "must be done or not_performed")
    if "result" in data and outcome is not EffectState.DONE:
        raise InvalidField("result", "only a done effect has a result")
    _job(deck, job_id)
    record = actions.resolve_effect(
        deck.store, job_id, key, outcome, guard.actor(), deck.clock(), result=data.get("result")
    )
    return jsonify(record.to_dict())
