"""Failed or dead jobs grouped by error, over JSON.

    GET /api/errors?status=dead|failed   -> {"status", "groups": [{type, fingerprint, count,
                                             first_seen, last_seen, sample: {id, error}}]}

The largest groups first, at most ``jobdeck.store.reads.MAX_ERROR_GROUPS``. Same
bearer token as the rest of ``/api``; a group's jobs are listed (and acted on
in the dashboard) by its type and fingerprint.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.models import ERROR_STATES
from jobdeck.store.reads import ErrorGroup, error_groups
from jobdeck.web.api import jobs as api
from jobdeck.web.serialize import iso

bp = Blueprint("api_errors", __name__, url_prefix="/api/errors")
bp.before_request(api._authenticate)
bp.before_request(api.require_json_body)

DEFAULT_STATUS = State.DEAD.value


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


def parse_status(raw: str | None) -> State:
    """``dead`` (the default, when ``status`` is absent) or ``failed``;
    anything else, the empty ``?status=`` too, is a 422 naming both: an
    empty value is a client's mistake (a form's unset field), not a choice."""
    value = DEFAULT_STATUS if raw is None else raw
    if value not in ERROR_STATES:
        raise InvalidField("status", f"unknown status {value[:40]!r}; one of {', '.join(ERROR_STATES)}")
    return State(value)


def group_json(group: ErrorGroup) -> dict[str, Any]:
    return {
        "type": group.type,
        "fingerprint": group.fingerprint,
        "count": group.count,
        "first_seen": iso(group.first_seen),
        "last_seen": iso(group.last_seen),
        "sample": {"id": group.sample_id, "error": group.sample_error},
    }


@bp.get("")
def index() -> Any:
    state = parse_status(request.args.get("status"))
    groups = error_groups(_deck().store, state)
    return jsonify({"status": state.value, "groups": [group_json(g) for g in groups]})
