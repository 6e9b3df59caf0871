"""Dashboard pages and the fragments htmx polls. Each fragment is the same
partial the page includes, so a page and its live refresh never disagree.

Polled fragments hold no user input: the list polls only its table body
(the filter form, the selection bar and any open confirmation live outside
it), the job page polls only its status panel."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, abort, current_app, redirect, render_template, request, session, url_for
from jobdeck.core.config_tables import trace_url
from jobdeck.core.errors import JobNotFound
from jobdeck.core.states import SOURCES, AttemptOutcome, State, Transition, allowed
from jobdeck.core.validation import parse_int
from jobdeck.docs import DOCS_PORT, DOCS_URL
from jobdeck.store import JobRecord
from jobdeck.store.audit import audit_of_job, interrupted_bulk, list_audit
from jobdeck.store.reads import (
    BADGE_WINDOW,
    MAX_ERROR_GROUPS,
    badge_counts,
    count_matching,
    dead_since,
    error_groups,
    last_dead,
    list_page,
    newest_id,
    running_by_worker,
)
from jobdeck.tracing import trace_link
from jobdeck.web.dashboard.auth import current_user
from jobdeck.web.dashboard.membership import membership_of
from jobdeck.web.dashboard.present import latency_chart, throughput_chart
from jobdeck.web.dashboard.replies import deck, flash_response, snapshots
from jobdeck.web.dashboard.settings import DashboardSettings
from jobdeck.web.dashboard.tabs import (
    ERROR_TABS,
    TABS,
    TRANSITIONS,
    ListArgs,
    Tab,
    error_tab_or_404,
    tab_of,
    tab_or_404,
)
from jobdeck.web.serialize import request_waiting

bp = Blueprint("dashboard", __name__)

PAGE_SIZE = 50
POLLED_STATES = frozenset({State.PENDING, State.RUNNING, State.FAILED, State.BLOCKED})
"""A job page keeps polling while the job can still move without a person
(a blocked one moves when its dependencies complete)."""


def settings() -> DashboardSettings:
    s: DashboardSettings = current_app.extensions["jobdeck_dashboard"]
    return s


@bp.app_context_processor
def _layout() -> dict[str, Any]:
    user = current_user() if request.endpoint else None
    return {
        "user": user,
        "dash": settings(),
        "poll_seconds": settings().poll_seconds,
        "nav_items": nav_items(),
        "tabs": TABS,
        "Transition": Transition,
        "State": State,
        "AttemptOutcome": AttemptOutcome,
        "SOURCES": SOURCES,
        "tab_of": tab_of,
        "allowed": allowed,
        "docs_port": DOCS_PORT,
        "docs_url": DOCS_URL,
    }


@bp.app_context_processor
def _waiting_reasons() -> dict[str, Any]:
    """Why each pending or failed job shown is waiting (``_waiting_reason.html``,
    in the list rows and on the job page): the request's reasons, read once at
    the first job that asks, so a list of 50 rows reads the store once."""
    return {"waiting_reasons": request_waiting() if request.endpoint else None}


def nav_items() -> list[tuple[str, str, str]]:
    """(endpoint, label, section) of the top navigation (``NAV``): every
    endpoint it names is registered by ``create_app``."""
    items: list[tuple[str, str, str]] = current_app.extensions["jobdeck_nav"]
    return items


# -- overview ----------------------------------------------------------------------


OVERVIEW_DEAD_TYPES = 5
"""Job types the overview's dead-letter card lists, most recent first."""
OVERVIEW_DEAD_SCAN = PAGE_SIZE
"""Dead jobs, the last to die first, the card looks through for them: as
many as one page of the dead letter list reads at every poll (whole rows,
payloads included, so not more)."""


def _dead_by_type() -> list[JobRecord]:
    """The job of each type that died last, among the jobs that died last:
    from the overview, one click reaches every dead job of a type (to retry
    them all) and the latest one (to see why it died)."""
    latest: dict[str, JobRecord] = {}
    for job in last_dead(deck().store, OVERVIEW_DEAD_SCAN):
        latest.setdefault(job.type, job)
    return list(latest.values())[:OVERVIEW_DEAD_TYPES]


def _overview(first_paint: bool = False) -> dict[str, Any]:
    d = deck()
    now = d.clock()
    snap = snapshots().get(now, first_paint=first_paint)
    seen_raw = session.get("dead_seen")
    if isinstance(seen_raw, str):
        new_dead = dead_since(d.store, datetime.fromisoformat(seen_raw))
    else:
        new_dead = snap.counts.get(State.DEAD.value, 0)
    return {
        "now": now,
        "snap": snap,
        "counts": snap.counts,
        "throughput": throughput_chart(snap.throughput),
        "latency": latency_chart(snap.latency_history, now),
        **_worker_summary(now),
        "new_dead": new_dead,
        "dead_by_type": _dead_by_type(),
    }


def _is_live(worker: dict[str, Any], cutoff: datetime) -> bool:
    """Heart-beating, not stopped, and not marked gone by the sweeper."""
    return worker["stopped_at"] is None and worker.get("gone_at") is None and worker["heartbeat_at"] >= cutoff


def _worker_summary(now: datetime) -> dict[str, Any]:
    """The overview's live workers, and how many are gone (not stopped)."""
    cutoff = now - timedelta(seconds=deck().config.stall_timeout)
    everyone = deck().store.list_workers()
    live = [w for w in everyone if _is_live(w, cutoff)]
    gone = sum(1 for w in everyone if w["stopped_at"] is None and not _is_live(w, cutoff))
    return {"workers": live, "gone_workers": gone}


@bp.get("/")
def overview() -> Any:
    return render_template("overview.html", **_overview(first_paint=True))


@bp.get("/fragments/overview")
def overview_live() -> Any:
    return render_template("_overview_live.html", **_overview())


# -- job lists -----------------------------------------------------------------------


def _list(tab: Tab, source: Any = None) -> dict[str, Any]:
    """A list's context; the filter comes from ``source`` (the URL's
    arguments unless given, e.g. the fields a bulk form posted along)."""
    d = deck()
    now = d.clock()
    args = ListArgs.parse(request.args if source is None else source)
    paged = args.job_filter(tab, PAGE_SIZE)
    page = list_page(d.store, paged, now, d.config.max_list_bytes)
    # Counted right after the rows, not from the overview's snapshot, and
    # under the same filter: a tab's badge must agree with the rows it heads.
    counts = badge_counts(d.store, paged, now, BADGE_WINDOW, page)
    return {
        "tab": tab,
        "args": args,
        "page": page,
        "now": now,
        "counts": counts,
        "badge_window": BADGE_WINDOW,
        "types": sorted(set(d.registry.names()) | set(d.config.external_types)),
        "queues": sorted({"default"} | {s.queue for n in d.registry.names() if (s := d.registry.get(n)) and s.queue}),
    }


@bp.get("/jobs")
def jobs_index() -> Any:
    return redirect(url_for("dashboard.jobs", tab=State.PENDING.value))


@bp.get("/jobs/<tab>")
def jobs(tab: str) -> Any:
    t = tab_or_404(tab)
    context = _list(t)
    if t.state is State.DEAD:
        session["dead_seen"] = context["now"].isoformat()
    user = current_user()
    # The page that starts bulk actions says when the last one was cut short.
    context["interrupted"] = interrupted_bulk(deck().store, user.name, context["now"]) if user else None
    return render_template("jobs.html", **context)


@bp.get("/fragments/jobs/<tab>/rows")
def job_rows(tab: str) -> Any:
    return render_template("_job_rows_poll.html", **_list(tab_or_404(tab)))


@bp.get("/jobs/<tab>/confirm/<action>")
def confirm(tab: str, action: str) -> Any:
    """The confirmation of "all N matching": N counted exactly, now, up to
    the newest job id, which the action then keeps to."""
    t = tab_or_404(tab)
    transition = TRANSITIONS.get(action)
    if transition is None:
        abort(404)
    if not t.can(transition):
        return flash_response(f"{t.label} jobs cannot be {action}ed.", "error", 409)
    d = deck()
    now = d.clock()
    args = ListArgs.parse(request.args)
    up_to = newest_id(d.store)
    n = count_matching(d.store, args.job_filter(t, paged=False), now, SOURCES[transition], up_to)
    return render_template("_confirm.html", tab=t, args=args, action=action, n=n, up_to=up_to)


# -- one job ---------------------------------------------------------------------------


def _job(job_id: int) -> dict[str, Any]:
    d = deck()
    try:
        job = d.store.get(job_id)
    except JobNotFound:
        abort(404, f"job {job_id} does not exist")
    return {
        "job": job,
        "attempts": d.store.attempts_of(job_id),
        "now": d.clock(),
        "polling": job.status in POLLED_STATES,
        "audit": audit_of_job(d.store, job_id),
        "effects": d.store.ledger.of_job(job_id),
        "membership": membership_of(d.store, job),
        "trace_link": trace_link(trace_url(d.config), job.traceparent),
    }


def job_context(job_id: int, **extra: Any) -> dict[str, Any]:
    context = _job(job_id)
    context.update(extra)
    return context


@bp.get("/jobs/<int:job_id>")
def job(job_id: int) -> Any:
    return render_template("job.html", **_job(job_id))


@bp.get("/fragments/jobs/<int:job_id>")
def job_live(job_id: int) -> Any:
    """The status panel; the timeline and the edit form come along
    out-of-band only when the job changed state or gained an attempt, so
    an expanded traceback or a half-edited payload is left alone."""
    context = _job(job_id)
    seen_status = request.args.get("status")
    seen_attempts = request.args.get("attempts", type=int)
    context["changed"] = seen_status != context["job"].status.value or seen_attempts != len(context["attempts"])
    return render_template("_job_live_poll.html", **context)


# -- workers and audit --------------------------------------------------------------------


def _workers() -> dict[str, Any]:
    d = deck()
    now = d.clock()
    cutoff = now - timedelta(seconds=d.config.stall_timeout)
    everyone = d.store.list_workers()
    live = [w for w in everyone if _is_live(w, cutoff)]
    # Gone: never said goodbye (marked by the sweeper, or silent past the
    # stall timeout and not swept yet); their running jobs await rescue.
    gone = [w for w in everyone if w["stopped_at"] is None and not _is_live(w, cutoff)]
    gone.sort(key=lambda w: w.get("gone_at") or w["heartbeat_at"], reverse=True)
    stopped = [w for w in everyone if w["stopped_at"] is not None][:20]
    return {
        "now": now,
        "live": live,
        "gone": gone[:50],
        "stopped": stopped,
        "held": running_by_worker(d.store, [w["id"] for w in live + gone[:50] if w["running"]]),
        "stall_timeout": d.config.stall_timeout,
        "clock_skew_warn": d.config.clock_skew_warn,
    }


@bp.get("/workers")
def workers() -> Any:
    return render_template("workers.html", **_workers())


@bp.get("/fragments/workers")
def workers_live() -> Any:
    return render_template("_workers_live.html", **_workers())


@bp.get("/audit")
def audit() -> Any:
    raw = request.args.get("before", "")
    before = parse_int(raw, "before", 1) if raw.strip() else None
    entries, older = list_audit(deck().store, before_id=before)
    return render_template("audit.html", entries=entries, older=older, before=before, now=deck().clock())


# -- errors, grouped ----------------------------------------------------------------


def _errors(tab: Tab) -> dict[str, Any]:
    """The errors page's context: the tab's jobs grouped by type and error
    fingerprint (``jobdeck.store.reads.error_groups``), largest first."""
    d = deck()
    now = d.clock()
    return {
        "tab": tab,
        "error_tabs": ERROR_TABS,
        "groups": error_groups(d.store, tab.state),
        "limit": MAX_ERROR_GROUPS,
        "now": now,
        "counts": snapshots().get(now).counts,
    }


@bp.get("/errors")
def errors_index() -> Any:
    return redirect(url_for("dashboard.errors", tab=State.DEAD.value))


@bp.get("/errors/<tab>")
def errors(tab: str) -> Any:
    return render_template("errors.html", **_errors(error_tab_or_404(tab)))


@bp.get("/fragments/errors/<tab>")
def errors_live(tab: str) -> Any:
    return render_template("_error_groups.html", **_errors(error_tab_or_404(tab)))
