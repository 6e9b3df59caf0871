"""The effects ledger over JSON: an HTTP worker's steps, a job's effects,
and a person's word on an unknown one.

    POST /api/jobs/<id>/effects/<key>/start     {"worker_id", "attempt", "replay_safe"}
                                                -> {"decision": "perform" | "skip" | "wait", "effect", "replayed"}
                                                   409 when the outcome is unknown: the job went to dead
    POST /api/jobs/<id>/effects/<key>/finish    {"worker_id", "attempt", "result"} -> the effect, done
    POST /api/jobs/<id>/effects/<key>/withdraw  {"worker_id", "attempt"} -> the effect, not performed
    GET  /api/jobs/<id>/effects                 -> {"effects": [Effect]}
    POST /api/jobs/<id>/effects/<key>/resolve   {"outcome": "done" | "not_performed", "result": ...}
                                                -> the effect; then retry the job

The worker's steps follow ``ctx.effect``'s rules on the same rows
(``jobdeck.jobs.effects``). Same bearer token and body rules as the rest of
``/api``; each resolve is recorded in the audit log as done by the token
(``token:NAME``, or ``api``),
like the API's retry.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from jobdeck import actions
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import EFFECT_RESOLUTIONS, EffectState
from jobdeck.deck import Jobdeck
from jobdeck.jobs import effects
from jobdeck.web import guard
from jobdeck.web.api import jobs as api

bp = Blueprint("api_effects", __name__, url_prefix="/api/jobs")
bp.before_request(api._authenticate)

OUTCOMES = {s.value: s for s in EFFECT_RESOLUTIONS}


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


def _step(data: dict[str, Any]) -> tuple[str, int]:
    """The worker and the attempt a step is for (the claim's ``attempt``)."""
    return api._worker_id(data), api._attempt(data)


@bp.post("/<int:job_id>/effects/<path:key>/start")
def start(job_id: int, key: str) -> Any:
    """Record ``key`` started by the worker's attempt before it performs the
    side effect, or say why not (``jobdeck.jobs.effects.Decision``)."""
    deck = _deck()
    data = api._body()
    key = effects.checked_key(key)
    worker_id, attempt = _step(data)
    replay_safe = data.get("replay_safe", False)
    if not isinstance(replay_safe, bool):
        raise InvalidField("replay_safe", "must be true or false")
    begun = effects.start(deck.store, key, job_id, attempt, worker_id, deck.clock(), replay_safe=replay_safe)
    effect = begun.record.to_dict()
    caller = guard.principal()
    if caller is not None and caller.confined and begun.record.job_id != job_id:
        effect.update(job_id=None, attempt=None, worker_id=None)  # another job's: not for a confined token
    return jsonify({"decision": begun.decision.value, "effect": effect, "replayed": begun.replayed is not None})


@bp.post("/<int:job_id>/effects/<path:key>/finish")
def finish(job_id: int, key: str) -> Any:
    """The side effect happened: ``done``, with ``result`` for every later
    attempt that reaches the key."""
    deck = _deck()
    data = api._body()
    key = effects.checked_key(key)
    worker_id, attempt = _step(data)
    _job(deck, job_id)
    limit = deck.config.max_result_bytes
    record = effects.finish(deck.store, key, job_id, attempt, worker_id, data.get("result"), limit, deck.clock())
    return jsonify(record.to_dict())


@bp.post("/<int:job_id>/effects/<path:key>/withdraw")
def withdraw(job_id: int, key: str) -> Any:
    """The side effect certainly did not happen: ``not_performed``, so the
    next attempt that reaches the key performs it."""
    deck = _deck()
    data = api._body()
    key = effects.checked_key(key)
    worker_id, attempt = _step(data)
    _job(deck, job_id)
    return jsonify(effects.withdraw(deck.store, key, job_id, attempt, worker_id, deck.clock()).to_dict())


@bp.post("/<int:job_id>/effects/<path:key>/resolve")
def resolve(job_id: int, key: str) -> Any:
    """Mark an unknown (started) effect done or not performed (409 for any
    other state): the job's next attempt then skips it, returning
    ``result``, or performs it."""
    deck = _deck()
    data = api._body()
    key = effects.checked_key(key)
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
