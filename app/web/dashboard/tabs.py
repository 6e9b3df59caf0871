"""The job-list tabs and the filter a request asks for, both derived from
``jobdeck.core.states``: one tab per state, with ``scheduled`` split out of pending."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import abort
from jobdeck.core.fingerprint import MAX_CHARS as MAX_FINGERPRINT_CHARS
from jobdeck.core.states import ALL_STATES, SOURCES, State, Transition
from jobdeck.core.validation import MAX_QUEUE_CHARS, MAX_SEARCH_CHARS, MAX_TYPE_CHARS, check_text, parse_int
from jobdeck.store import JobFilter, JobRecord
from werkzeug.datastructures import MultiDict

LABELS: dict[State, str] = {
    State.PENDING: "Pending",
    State.RUNNING: "Running",
    State.FAILED: "Failed",
    State.DEAD: "Dead letter",
    State.COMPLETED: "Completed",
    State.DISCARDED: "Discarded",
    State.CANCELLED: "Cancelled",
    State.BLOCKED: "Blocked",
}
SCHEDULED = "scheduled"


@dataclass(frozen=True)
class Tab:
    slug: str
    label: str
    state: State
    scheduled: bool | None
    """For pending: True the future ones (Scheduled), False the due ones."""

    def can(self, transition: Transition) -> bool:
        return self.state in SOURCES[transition]

    @property
    def run_now(self) -> bool:
        return self.scheduled is True or self.state is State.FAILED


def _tabs() -> list[Tab]:
    tabs: list[Tab] = []
    for state in ALL_STATES:
        if state is State.PENDING:
            tabs.append(Tab(state.value, LABELS[state], state, False))
            tabs.append(Tab(SCHEDULED, "Scheduled", state, True))
        else:
            tabs.append(Tab(state.value, LABELS[state], state, None))
    return tabs


TABS: list[Tab] = _tabs()
BY_SLUG: dict[str, Tab] = {t.slug: t for t in TABS}
TRANSITIONS: dict[str, Transition] = {"retry": Transition.RETRY, "discard": Transition.DISCARD}
"""The actions on "all N matching" of a tab, by their name in the URL."""


def tab_of(job: JobRecord, now: datetime) -> Tab:
    """The tab a job is listed in right now."""
    if job.status is State.PENDING:
        return BY_SLUG[SCHEDULED] if job.is_scheduled(now) else BY_SLUG[State.PENDING.value]
    return BY_SLUG[job.status.value]


def tab_or_404(slug: str) -> Tab:
    tab = BY_SLUG.get(slug)
    if tab is None:
        abort(404, f"no job list named {slug!r}")
    return tab


@dataclass(frozen=True)
class ListArgs:
    """The filter in the URL, so a view can be bookmarked."""

    type: str = ""
    queue: str = ""
    q: str = ""
    before: int | None = None
    after: int | None = None
    error: str = ""
    """An error group's fingerprint (``jobdeck.core.fingerprint``), from the errors page."""

    @classmethod
    def parse(cls, args: MultiDict[str, str]) -> ListArgs:
        """The filter, checked like the API's (``jobdeck.core.validation``): a NUL, an
        over-long term or a cursor that is no id raises ``InvalidField``, which
        the dashboard shows as a message."""
        return cls(
            type=check_text(args.get("type", "").strip(), "type", MAX_TYPE_CHARS),
            queue=check_text(args.get("queue", "").strip(), "queue", MAX_QUEUE_CHARS),
            q=check_text(args.get("q", "").strip(), "search", MAX_SEARCH_CHARS),
            before=_cursor(args, "before"),
            after=_cursor(args, "after"),
            error=check_text(args.get("error", ""), "error", MAX_FINGERPRINT_CHARS),
        )

    def job_filter(self, tab: Tab, limit: int = 50, paged: bool = True) -> JobFilter:
        return JobFilter(
            status=tab.state,
            scheduled=tab.scheduled,
            type=self.type or None,
            queue=self.queue or None,
            search=self.q or None,
            before_id=self.before if paged else None,
            after_id=self.after if paged else None,
            limit=limit,
            error_fingerprint=self.error or None,
        )

    def query(self, **changes: Any) -> dict[str, Any]:
        """URL arguments (for url_for) with ``changes``; empty ones left out."""
        values: dict[str, Any] = {"type": self.type, "queue": self.queue, "q": self.q,
                                  "before": self.before, "after": self.after, "error": self.error}  # fmt: skip
        values.update(changes)
        return {k: v for k, v in values.items() if v not in (None, "")}

    @property
    def filtered(self) -> bool:
        return bool(self.type or self.queue or self.q or self.error)

    def describe(self) -> str:
        named = (("type", self.type), ("queue", self.queue), ("search", self.q), ("error", self.error))
        parts = [f"{k}={v}" for k, v in named if v]
        return ", ".join(parts)


def _cursor(args: MultiDict[str, str], name: str) -> int | None:
    raw = args.get(name, "")
    return parse_int(raw, name, 1) if raw.strip() else None


ERROR_TABS: list[Tab] = [BY_SLUG[State.DEAD.value], BY_SLUG[State.FAILED.value]]
"""The errors page's two views: dead letter first (it waits for a person),
then the failed jobs awaiting their retry."""


def error_tab_or_404(slug: str) -> Tab:
    tab = BY_SLUG.get(slug)
    if tab not in ERROR_TABS:
        abort(404, f"no error view named {slug!r}; dead or failed")
    return tab
