"""Queue controls over JSON: list queues, pause and resume one.

    GET  /api/queues                  -> {"queues": [{name, paused, waiting, running, concurrency, [limits]}],
                                          "limits": [every rate or per-key limit with its use (jobdeck.jobs.flow_claim)]}
    POST /api/queues/<name>/pause     -> the queue; paused queues are not claimed from
    POST /api/queues/<name>/resume    -> the queue

Same bearer token as the rest of ``/api``. Each action is announced through
``jobdeck.actions`` (logged on ``jobdeck.audit`` and written to the audit log).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from jobdeck.core.errors import InvalidField
from jobdeck.core.validation import check_text
from jobdeck.deck import Jobdeck
from jobdeck.web import guard
from jobdeck.web.api import jobs as api

bp = Blueprint("api_queues", __name__, url_prefix="/api/queues")
bp.before_request(api._authenticate)
bp.before_request(api.require_json_body)


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def _name(name: str) -> str:
    if not name:
        raise InvalidField("name", "a queue name is 1 to 100 characters")
    return check_text(name, "name", 100)


@bp.get("")
def index() -> Any:
    deck = _deck()
    now = deck.clock()
    return jsonify({"queues": deck.queues.list_queues(now), "limits": deck.queues.flow_limits(now)})


@bp.post("/<path:name>/pause")
def pause(name: str) -> Any:
    deck = _deck()
    return jsonify(deck.queues.set_paused(_name(name), True, deck.clock(), guard.actor()))


@bp.post("/<path:name>/resume")
def resume(name: str) -> Any:
    deck = _deck()
    return jsonify(deck.queues.set_paused(_name(name), False, deck.clock(), guard.actor()))
