"""Job logs in the dashboard: the job page's log of each attempt
(``_job_logs.html``) and the fragment its running attempt polls, which
answers only the lines after the last one the page has (``after``) and a
new poller while the attempt still runs; once it ended, the lines and no
poller, so the polling stops. Lines are user data: Jinja escapes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, abort, render_template, request
from jobdeck.core.errors import InvalidField, JobNotFound
from jobdeck.core.states import State
from jobdeck.core.validation import INT64_MAX, parse_int
from jobdeck.store import JobRecord
from jobdeck.store.joblogs import StoredLine, lines_of
from jobdeck.web.dashboard.replies import deck

bp = Blueprint("joblogs", __name__)

PAGE_LINES = 5000
"""The most lines the job page shows; the API has every one."""


@dataclass
class AttemptLines:
    attempt: int
    lines: list[StoredLine] = field(default_factory=list)
    live: bool = False
    """The attempt is running: its list ends with the poller."""

    @property
    def last_id(self) -> int:
        return self.lines[-1].id if self.lines else 0


@dataclass
class JobLogView:
    attempts: list[AttemptLines]
    total: int
    cut: bool
    """More than ``PAGE_LINES``: only the first are shown."""


def running_attempt(job: JobRecord) -> int | None:
    return job.attempt if job.status is State.RUNNING and job.attempt > 0 else None


@bp.app_template_global("job_log")
def job_log(job: JobRecord) -> JobLogView:
    """The page's view of the job's log: each attempt that logged, and the
    running one (even before its first line, so its poller is there)."""
    lines = lines_of(deck().store, job.id, limit=PAGE_LINES + 1)
    cut = len(lines) > PAGE_LINES
    by_attempt: dict[int, AttemptLines] = {}
    for line in lines[:PAGE_LINES]:
        by_attempt.setdefault(line.attempt, AttemptLines(line.attempt)).lines.append(line)
    live = running_attempt(job)
    if live is not None and not cut:
        by_attempt.setdefault(live, AttemptLines(live)).live = True
    attempts = [by_attempt[a] for a in sorted(by_attempt)]
    return JobLogView(attempts, min(len(lines), PAGE_LINES), cut)


@bp.app_template_filter("log_time")
def _log_time(line: StoredLine) -> str:
    return line.at.strftime("%H:%M:%S.") + f"{line.at.microsecond // 1000:03d}"


def _arg(name: str, high: int) -> int:
    raw = request.args.get(name, "")
    try:
        return parse_int(raw, name, 0, high)
    except InvalidField:
        abort(400, f"{name}: expected a number from 0 to {high}")


@bp.get("/fragments/jobs/<int:job_id>/logs")
def job_log_more(job_id: int) -> Any:
    """The lines of ``attempt`` after ``after``, then the poller again while
    that attempt runs."""
    attempt = _arg("attempt", 2**31 - 1)
    after = _arg("after", INT64_MAX)
    try:
        job = deck().store.get(job_id)
    except JobNotFound:
        abort(404, f"job {job_id} does not exist")
    lines = lines_of(deck().store, job_id, attempt=attempt, after=after, limit=PAGE_LINES)
    view = AttemptLines(attempt, lines, live=running_attempt(job) == attempt and len(lines) < PAGE_LINES)
    after_id = view.last_id or after
    return render_template("_job_log_more.html", job=job, a=view, after_id=after_id)
