"""The workflows and batches pages: lists with progress, a workflow's graph
(server-side SVG, ``graph_svg``) and jobs table polled live, a batch's
progress and callbacks, and the two workflow actions, "Retry failed part"
and "Cancel the rest" (POST, CSRF-checked by CSRFProtect, operators only,
audited, confirmed in the page first like the bulk actions)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import Blueprint, abort, render_template, request
from jobdeck.core.errors import JobNotFound
from jobdeck.core.states import DEPENDENCY_FAILED, ENDED, SOURCES, State, Transition
from jobdeck.core.validation import parse_int
from jobdeck.jobs.workflows import act_on_workflow
from jobdeck.store import JobRecord
from jobdeck.store.graph import BatchNotFound, BatchRecord, WorkflowGraph, WorkflowNotFound
from jobdeck.web.dashboard.auth import current_user, require_operator
from jobdeck.web.dashboard.graph_svg import MAX_SVG_NODES, Drawing, draw
from jobdeck.web.dashboard.replies import deck, flash_response, is_htmx, snapshots
from jobdeck.web.dashboard.tabs import tab_of

bp = Blueprint("workflows", __name__)

PAGE_SIZE = 50
BATCH_JOBS_SHOWN = 200
"""A batch's page lists its first jobs only: a batch may hold many
thousands, and its counts by state already say where all of them stand."""
ACTIONS: dict[str, Transition] = {"retry": Transition.RETRY, "cancel": Transition.CANCEL}
LIVE_WORKFLOW = frozenset({"running", "held"})
"""A workflow page polls while its jobs can still move; a held one too,
since the dead job it waits on may be retried from another page."""


def _before() -> int | None:
    raw = request.args.get("before", "")
    return parse_int(raw, "before", 1) if raw.strip() else None


def _page(rows: list[Any]) -> tuple[list[Any], int | None]:
    """One page of a newest-first list read one row too long, and the
    cursor of the next older page (None on the last)."""
    if len(rows) > PAGE_SIZE:
        return rows[:PAGE_SIZE], rows[PAGE_SIZE - 1].id
    return rows, None


# -- workflows -----------------------------------------------------------------------


@bp.get("/workflows")
def index() -> Any:
    before = _before()
    rows, older = _page(deck().store.list_workflows(limit=PAGE_SIZE + 1, before=before))
    return render_template("workflows.html", workflows=rows, older=older, before=before, now=deck().clock())


@dataclass(frozen=True)
class Row:
    """A job of a workflow as its table shows it."""

    job: JobRecord
    slug: str
    label: str
    depends_on: list[str]
    note: str
    """Why it stands where it is, when that comes from its dependencies."""
    cascaded: bool = False
    """Cancelled because a dependency will not complete."""
    held: bool = False
    """Blocked behind a dependency that will not complete until retried."""


def _rows(graph: WorkflowGraph, now: datetime) -> list[Row]:
    by_id = {j.id: j for j in graph.jobs}
    deps: dict[int, list[JobRecord]] = {}
    for job_id, dep in graph.edges:
        if dep in by_id:
            deps.setdefault(job_id, []).append(by_id[dep])
    rows = []
    for j in graph.jobs:
        mine = deps.get(j.id, [])
        failed = [d for d in mine if d.status in DEPENDENCY_FAILED]
        # Cancelled while blocked with a reason: only a dependency's failure
        # gives one (a person's cancel does not), and it stays after that
        # dependency is retried, as the job stays cancelled.
        cascaded = j.status is State.CANCELLED and bool(mine) and j.attempt == 0 and bool(j.error)
        held = j.status is State.BLOCKED and bool(failed)
        note = ""
        if cascaded:
            note = j.error or ""
        elif held:
            note = f"held until {', '.join(_step(d) for d in failed)} is retried and completes"
        elif j.status is State.BLOCKED:
            waiting = [_step(d) for d in mine if d.status is not State.COMPLETED]
            note = f"waits for {', '.join(waiting)}" if waiting else ""
        tab = tab_of(j, now)
        rows.append(Row(j, tab.slug, tab.label, [_step(d) for d in mine], note, cascaded, held))
    return rows


def _step(job: JobRecord) -> str:
    return job.step or f"#{job.id}"


def _graph_or_404(workflow_id: int) -> WorkflowGraph:
    try:
        return deck().store.workflow(workflow_id)
    except WorkflowNotFound as exc:
        abort(404, str(exc))


def _movable(graph: WorkflowGraph) -> dict[str, int]:
    """How many of its jobs each action would move now."""
    return {name: sum(1 for j in graph.jobs if j.status in SOURCES[t]) for name, t in ACTIONS.items()}


def _workflow(workflow_id: int) -> dict[str, Any]:
    now = deck().clock()
    graph = _graph_or_404(workflow_id)
    rows = _rows(graph, now)
    drawing: Drawing | None = None
    if len(graph.jobs) <= MAX_SVG_NODES:
        drawing = draw(graph.jobs, graph.edges, {r.job.id: r.slug for r in rows})
    return {
        "wf": graph.workflow,
        "rows": rows,
        "drawing": drawing,
        "max_svg_nodes": MAX_SVG_NODES,
        "cascaded": [r for r in rows if r.cascaded],
        "held": [r for r in rows if r.held],
        "can": _movable(graph),
        "polling": graph.workflow.state in LIVE_WORKFLOW,
        "now": now,
    }


@bp.get("/workflows/<int:workflow_id>")
def workflow(workflow_id: int) -> Any:
    return render_template("workflow.html", **_workflow(workflow_id))


@bp.get("/fragments/workflows/<int:workflow_id>")
def workflow_live(workflow_id: int) -> Any:
    return render_template("_workflow_live.html", **_workflow(workflow_id))


@bp.get("/workflows/<int:workflow_id>/confirm/<action>")
def confirm(workflow_id: int, action: str) -> Any:
    """The confirmation of a workflow action, with how many jobs it moves now."""
    if action not in ACTIONS:
        abort(404)
    graph = _graph_or_404(workflow_id)
    return render_template("_workflow_confirm.html", action=action, n=_movable(graph)[action], wf=graph.workflow)


@bp.post("/workflows/<any(retry, cancel):action>")
@require_operator
def act(action: str) -> Any:
    """Retry the failed part (failed, dead and discarded jobs; held
    dependents then run as those complete) or cancel the rest (running jobs
    are asked to stop). The workflow comes in the form, as the bulk
    actions carry their filter."""
    workflow_id = parse_int(request.form.get("workflow_id", ""), "workflow_id", 1)
    d = deck()
    user = current_user()
    transition = Transition.RETRY if action == "retry" else Transition.CANCEL
    try:
        moved = act_on_workflow(d, workflow_id, transition, user.name if user else "?", f"{action} workflow")
    except WorkflowNotFound as exc:
        return flash_response(str(exc), "error", 404)
    snapshots().invalidate()
    message = _moved_message(action, moved, d.store.workflow(workflow_id))
    body = ""
    if is_htmx():
        body = render_template("_workflow_live.html", **_workflow(workflow_id)) + _CLEAR_CONFIRM
    return flash_response(message, "success" if moved else "info", 200, body)


_CLEAR_CONFIRM = '<div id="confirm" hx-swap-oob="true"></div>'


def _moved_message(action: str, moved: list[int], graph: WorkflowGraph) -> str:
    n = len(moved)
    jobs = "job" if n == 1 else "jobs"
    if action == "retry":
        if not n:
            return "Nothing to retry: no job of this workflow is failed, dead or discarded."
        return f"{n} {jobs} retried; the jobs held behind them run once they complete."
    if not n:
        return "Nothing to cancel: every job of this workflow has ended."
    ids = set(moved)
    running = sum(1 for j in graph.jobs if j.id in ids and j.status is State.RUNNING)
    message = f"{n} {jobs} cancelled."
    if running:
        message += f" {running} running {'one is' if running == 1 else 'ones are'} asked to stop."
    return message


# -- batches -------------------------------------------------------------------------


@bp.get("/batches")
def batches() -> Any:
    before = _before()
    rows, older = _page(deck().store.list_batches(limit=PAGE_SIZE + 1, before=before))
    return render_template("batches.html", batches=rows, older=older, before=before, now=deck().clock())


def _callbacks(batch: BatchRecord) -> list[dict[str, Any]]:
    """Each callback set, with the job it fired once the batch fired."""
    fired = (batch.outcome or {}).get("callbacks", {})
    jobs: dict[str, JobRecord | None] = {}
    for name, job_id in fired.items():
        try:
            jobs[name] = deck().store.get(int(job_id))
        except JobNotFound:  # retention removed it
            jobs[name] = None
    return [
        {"name": name, "type": spec.get("type", ""), "job_id": fired.get(name), "job": jobs.get(name)}
        for name, spec in batch.callbacks.items()
        if spec
    ]


def _batch(batch_id: int) -> dict[str, Any]:
    d = deck()
    now = d.clock()
    try:
        batch = d.store.batch(batch_id)
    except BatchNotFound as exc:
        abort(404, str(exc))
    shown = d.store.batch_jobs(batch_id, limit=BATCH_JOBS_SHOWN)
    callbacks = _callbacks(batch)
    ended = {s.value for s in ENDED}
    return {
        "batch": batch,
        "jobs": [(j, tab_of(j, now)) for j in shown],
        "shown": BATCH_JOBS_SHOWN,
        "callbacks": callbacks,
        "counts": sorted(batch.counts.items(), key=lambda kv: (kv[0] in ended, kv[0])),
        # Once fired, it polls on until its callback jobs have ended too.
        "polling": batch.state != "fired" or any(c["job"] and c["job"].status not in ENDED for c in callbacks),
        "now": now,
    }


@bp.get("/batches/<int:batch_id>")
def batch(batch_id: int) -> Any:
    return render_template("batch.html", **_batch(batch_id))


@bp.get("/fragments/batches/<int:batch_id>")
def batch_live(batch_id: int) -> Any:
    return render_template("_batch_live.html", **_batch(batch_id))
