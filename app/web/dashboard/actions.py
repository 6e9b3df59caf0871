"""Operator actions: each a POST (CSRF-checked by CSRFProtect), open to
operators only, recorded in the audit log as the API and the CLI record it
(``jobdeck.actions``), answered in place. A refused action (the job moved on
meanwhile) answers 409 with the job as it now stands and a message saying
why; never a 500.

Bulk actions over everything a filter matches run in batches of
``jobdeck.store.reads.BATCH`` jobs, one short request each: the progress fragment posts
the next batch when it loads, so no request grows with the number of jobs
and the operator watches it advance."""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, abort, current_app, render_template, request
from jobdeck import actions as operate
from jobdeck.core.errors import (
    EffectNotFound,
    EffectResolveRefused,
    InvalidField,
    JobNotFound,
    PayloadTooLarge,
    TransitionRefused,
)
from jobdeck.core.states import EFFECT_RESOLUTIONS, SOURCES, EffectState, State, Transition
from jobdeck.core.validation import loads, parse_int, parse_priority, parse_time
from jobdeck.store import JobRecord
from jobdeck.store.audit import Tally, audit_entry, open_bulk
from jobdeck.store.lifecycle import Seen
from jobdeck.store.reads import iter_batches
from jobdeck.web.dashboard.auth import current_user, require_operator
from jobdeck.web.dashboard.replies import deck, flash_response, is_htmx, snapshots
from jobdeck.web.dashboard.tabs import BY_SLUG, TRANSITIONS, ListArgs, Tab, tab_or_404
from jobdeck.web.dashboard.views import _list, job_context

bp = Blueprint("actions", __name__, url_prefix="/actions")

PAST = {"retry": "retried", "discard": "discarded", "run-now": "made due now", "edit": "edited and retried"}
MAX_SELECTED = 1000
SELECTED: dict[str, Transition] = {**TRANSITIONS, "cancel": Transition.CANCEL}
"""The actions on ticked rows: those of "all matching", and cancel."""


def _actor() -> str:
    user = current_user()
    return user.name if user else "?"


def _render_job(job_id: int, where: str, tab: Tab | None, **extra: Any) -> str:
    """The job as it now stands, shaped like what the button was in."""
    if where == "detail":
        return render_template("_job_detail.html", **job_context(job_id, **extra))
    context = job_context(job_id)
    return render_template("_job_row.html", tab=tab, args=ListArgs(), moved=True, **context)


@bp.post("/jobs/<int:job_id>/<action>")
@require_operator
def single(job_id: int, action: str) -> Any:
    """Retry, Discard, Run now or Cancel on one job, from its row or its page."""
    if action not in TRANSITIONS and action not in ("run-now", "cancel"):
        abort(404)
    d = deck()
    now = d.clock()
    where = request.form.get("from", "row")
    tab = BY_SLUG.get(request.form.get("tab", ""))
    if action == "cancel":
        return _cancel(job_id, where, tab)
    move = {"retry": operate.retry, "discard": operate.discard, "run-now": operate.run_now}[action]
    try:
        move(d.store, job_id, _actor(), now)
    except JobNotFound as exc:
        return flash_response(str(exc), "error", 404)
    except TransitionRefused as exc:  # RunNowRefused too; audited by jobdeck.actions
        body = _render_job(job_id, where, tab) if is_htmx() else ""
        return flash_response(f"Refused: {exc}.", "error", 409, body)
    snapshots().invalidate()
    body = _render_job(job_id, where, tab) if is_htmx() else ""
    return flash_response(f"Job {job_id} {PAST[action]}.", "success", 200, body)


def _cancel(job_id: int, where: str, tab: Tab | None) -> Any:
    """Cancel (``jobdeck.actions.cancel`` audit-logs it, refusals too): a
    running job is asked to stop and ends cancelled when its attempt ends."""
    d = deck()
    try:
        job = operate.cancel(d.store, job_id, _actor(), d.clock())
    except JobNotFound as exc:
        return flash_response(str(exc), "error", 404)
    except TransitionRefused as exc:
        body = _render_job(job_id, where, tab) if is_htmx() else ""
        return flash_response(f"Refused: {exc}.", "error", 409, body)
    snapshots().invalidate()
    body = _render_job(job_id, where, tab) if is_htmx() else ""
    if job.status is State.RUNNING:
        message = f"Job {job_id} is asked to stop; it ends cancelled when its attempt ends."
    else:
        message = f"Job {job_id} cancelled."
    return flash_response(message, "success", 200, body)


@bp.post("/jobs/<int:job_id>/edit")
@require_operator
def edit(job_id: int) -> Any:
    """Edit a waiting job from its page: payload, priority, queue, run-at.
    A pending, scheduled or failed job keeps its state; a dead one is edited
    and retried. The form carries the job as it showed it (``seen_*``), and
    the edit is refused in place if the job moved on since; only the fields
    that differ from the job as it stands are changed."""
    d = deck()
    now = d.clock()
    form = request.form
    try:
        job = d.store.get(job_id)
    except JobNotFound as exc:
        return flash_response(str(exc), "error", 404)
    try:
        seen = _seen(form)
        data = _edited_fields(form, job)
        if not data and job.status is not State.DEAD:
            return flash_response("Nothing changed: edit a field first.", "info", 200)
        edited = operate.edit(d.store, job_id, d.job_changes(data, job.type), _actor(), now, seen)
    except (InvalidField, PayloadTooLarge, json.JSONDecodeError) as exc:
        error = _edit_error(exc)
        body = _render_job(job_id, "detail", None, edit_form=form, edit_error=error) if is_htmx() else ""
        return flash_response(error, "error", 422, body)
    except JobNotFound as exc:
        return flash_response(str(exc), "error", 404)
    except TransitionRefused as exc:
        body = _render_job(job_id, "detail", None) if is_htmx() else ""
        return flash_response(f"Refused: {exc}.", "error", 409, body)
    snapshots().invalidate()
    body = _render_job(job_id, "detail", None) if is_htmx() else ""
    if job.status is State.DEAD:
        return flash_response(f"Job {job_id} edited and retried with the new payload.", "success", 200, body)
    return flash_response(f"Job {job_id} edited: {edited.summary()}.", "success", 200, body)


def _seen(form: Any) -> Seen | None:
    """The job as the form showed it; None from a form without it (the
    edit is then fenced on the job as read when it runs)."""
    raw = form.get("seen_updated_at", "")
    if not raw:
        return None
    status = form.get("seen_status", "")
    if status not in {s.value for s in SOURCES[Transition.EDIT]}:
        raise InvalidField("seen_status", "not a state a job can be edited in")
    return Seen(
        State(status), parse_int(form.get("seen_attempt", ""), "seen_attempt", 0), parse_time(raw, "updated_at")
    )


def _edited_fields(form: Any, job: JobRecord) -> dict[str, Any]:
    """The form's fields that differ from the job, as an edit's data
    (``Jobdeck.job_changes`` validates them). A blank priority, queue or
    run-at keeps the job's."""
    data: dict[str, Any] = {}
    if "payload" in form:
        payload = loads(form["payload"], "payload")
        if not isinstance(payload, dict):
            raise InvalidField("payload", "must be a JSON object ({...})")
        if payload != job.payload:
            data["payload"] = payload
    priority = form.get("priority", "").strip()
    if priority and parse_priority(priority) != job.priority:
        data["priority"] = priority
    queue = form.get("queue", "")
    if queue and queue != job.queue:
        data["queue"] = queue
    run_at = form.get("run_at", "").strip()
    # Compared to the second: the browser may write the value it was given without its seconds.
    if run_at and parse_time(run_at, "run_at") != job.available_at.replace(microsecond=0):
        data["run_at"] = run_at
    return data


def _edit_error(exc: Exception) -> str:
    """An edit's refused input in words (shown in the form, escaped)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    if isinstance(exc, PayloadTooLarge):
        return f"The {exc}."
    if isinstance(exc, InvalidField) and exc.field.startswith("payload"):
        if "must be a JSON object" in str(exc):
            return "The payload must be a JSON object ({...})."
        return f"Not an acceptable payload: {exc}."
    return f"Not acceptable: {exc}."


def _form_int(name: str) -> int | None:
    """A number the bulk progress fragment carries: ids and tallies, each
    within BIGINT (``InvalidField`` otherwise, shown as a message)."""
    raw = request.form.get(name, "")
    return parse_int(raw, name, 0) if raw.strip() else None


def _transition(action: str, tab: Tab) -> Transition:
    transition = TRANSITIONS.get(action)
    if transition is None:
        abort(404)
    return transition


@bp.post("/selected/<action>")
@require_operator
def selected(action: str) -> Any:
    """Retry, discard or cancel the rows the operator ticked (running ones
    are asked to stop and end cancelled when their attempt ends)."""
    tab = tab_or_404(request.form.get("tab", ""))
    transition = SELECTED.get(action)
    if transition is None:
        abort(404)
    ids = sorted({parse_int(v, "ids", 1) for v in request.form.getlist("ids")})
    if not ids:
        return flash_response("Select some jobs first.", "error", 422)
    if len(ids) > MAX_SELECTED:
        return flash_response(f"At most {MAX_SELECTED} jobs at once; use “all matching”.", "error", 422)
    d = deck()
    now = d.clock()
    entry = open_bulk(d.store, _actor(), f"{action} selected", now, total=len(ids),
                      detail=f"selected {len(ids)} in {tab.label}")  # fmt: skip
    batches = list(iter_batches(ids))
    moved: list[int] = []
    for i, batch in enumerate(batches):
        moved.extend(operate.move_ids(d.store, transition, batch, now, Tally(entry, last=i == len(batches) - 1)))
    skipped = len(ids) - len(moved)
    snapshots().invalidate()
    message = f"{len(moved)} of {len(ids)} selected jobs {_selected_past(action, tab)}."
    if skipped:
        message += f" {skipped} had moved on and were left alone."
    body = ""
    if is_htmx():
        body = render_template("_job_rows.html", **_list(tab, request.form))
    response = flash_response(message, "success" if not skipped else "info", 200, body)
    response.headers["HX-Trigger"] = "jd-selection-clear"
    return response


def _selected_past(action: str, tab: Tab) -> str:
    """What happened to the ticked rows, in words: running jobs cancelled
    are only asked to stop."""
    if action == "cancel":
        return "asked to stop; each ends cancelled when its attempt ends" if tab.state is State.RUNNING else "cancelled"
    return PAST[action]


@bp.post("/matching/<action>")
@require_operator
def matching(action: str) -> Any:
    """One batch of "all N matching". The first call opens the bulk action's
    audit entry; each next call carries it and the id it stopped below. How
    far it got is read from the entry, which each batch counts into in its
    own transaction (``jobdeck.store.audit``), never from the form."""
    tab = tab_or_404(request.form.get("tab", ""))
    transition = _transition(action, tab)
    if not tab.can(transition):
        return flash_response(f"{tab.label} jobs cannot be {PAST[action]}.", "error", 409)
    form = request.form
    args = ListArgs.parse(form)
    up_to = _form_int("up_to") or 0
    total = _form_int("total") or 0
    entry = _form_int("entry")
    below = _form_int("below") or up_to + 1
    d = deck()
    now = d.clock()
    if entry is None:
        what = f"all matching in {tab.label}" + (f" ({args.describe()})" if args.filtered else "")
        entry, done = operate.open_matching(d.store, transition, _actor(), now, total=total, detail=what), 0
    else:
        record = audit_entry(d.store, entry)
        if record is None or record.actor != _actor() or record.action != f"{action} all" or record.total is None:
            return flash_response("That bulk action is not one of yours to carry on.", "error", 409)
        if record.finished_at is not None:
            return flash_response(f"That bulk action has finished: {record.count} jobs {PAST[action]}.", "info", 409)
        total, done = record.total, record.count
    while True:
        step = operate.move_matching(d.store, transition, args.job_filter(tab, paged=False), entry, below, now)
        done += len(step.moved)
        below, finished = step.below, step.finished
        if finished or is_htmx():  # without htmx there is no next request to carry on
            break
    snapshots().invalidate()
    if not is_htmx():
        return flash_response(f"{done} jobs {PAST[action]}.", "success")
    vals = {"tab": tab.slug, **args.query(before=None, after=None), "up_to": up_to, "entry": entry, "below": below}
    body = render_template(
        "_bulk_progress.html", tab=tab, action=action, past=PAST[action], done=done, total=max(total, done),
        finished=finished, vals=vals, entry=entry,
    )  # fmt: skip
    if not finished:
        return current_app.response_class(body, mimetype="text/html")
    response = flash_response(f"{done} jobs {PAST[action]}.", "success", 200, body)
    response.headers["HX-Trigger"] = "jd-poll"
    return response


EFFECT_OUTCOMES = {s.value: s for s in EFFECT_RESOLUTIONS}


@bp.post("/jobs/<int:job_id>/effects/resolve")
@require_operator
def resolve_effect(job_id: int) -> Any:
    """Mark an unknown (started) effect of this job done or not performed,
    after a person checked the far side; the job's retry then skips or
    performs it. The key travels in the form: keys hold ``:`` and ``/``."""
    d = deck()
    now = d.clock()
    key = request.form.get("key", "")
    outcome = EFFECT_OUTCOMES.get(request.form.get("outcome", ""))
    if outcome is None:
        return flash_response("outcome: must be done or not_performed.", "error", 422)
    try:
        operate.resolve_effect(d.store, job_id, key, outcome, _actor(), now)
    except EffectNotFound as exc:
        return flash_response(f"{exc} on job {job_id}.", "error", 404)
    except EffectResolveRefused as exc:
        body = _render_job(job_id, "detail", None) if is_htmx() else ""
        return flash_response(f"Refused: {exc}.", "error", 409, body)
    body = _render_job(job_id, "detail", None) if is_htmx() else ""
    said = "done" if outcome is EffectState.DONE else "not performed"
    return flash_response(f"Effect {key} marked {said}; retry the job to go on.", "success", 200, body)
