"""A job as the operator commands print it: the ``--status`` words, the
``jobs`` table and the ``show`` page, worded as the dashboard words them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from jobdeck.cli.base import shown
from jobdeck.core.states import ALL_STATES, CLAIMABLE, State

if TYPE_CHECKING:
    from jobdeck.store import AttemptRecord, JobRecord


SCHEDULED = "scheduled"
"""Not a state: a pending job whose ``available_at`` is still ahead (the
dashboard's Scheduled tab)."""


def status_names(states: Iterable[State] = ALL_STATES) -> list[str]:
    """The ``--status`` vocabulary, in the state machine's order, with
    ``scheduled`` after ``pending`` (whose due jobs ``pending`` then names)."""
    wanted = set(states)
    names: list[str] = []
    for state in ALL_STATES:
        if state in wanted:
            names.append(state.value)
            if state is State.PENDING:
                names.append(SCHEDULED)
    return names


def shown_status(job: JobRecord, now: datetime) -> str:
    return SCHEDULED if job.is_scheduled(now) else job.status.value


def when(moment: datetime | None) -> str:
    """A time as the lists and the job page show it: UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def its_time(job: JobRecord) -> datetime | None:
    """The one time a list row shows besides its creation: when a waiting
    job is due, when a running one was claimed, when a finished one ended."""
    if job.status in CLAIMABLE:
        return job.available_at
    if job.status is State.RUNNING:
        return job.claimed_at
    return job.finished_at


def attempts_text(job: JobRecord, why: bool = False) -> str:
    """Attempts made / allowed, counted and worded as the dashboard does."""
    from jobdeck.present import attempts_text as text

    return text(job, why=why)


def error_text(job: JobRecord, first_line_only: bool = False) -> str:
    """The job's error as the dashboard words it: on a completed job it is
    an earlier attempt's, so it says so."""
    text = (job.error or "").split("\n", 1)[0] if first_line_only else job.error or ""
    return f"failed before succeeding: {text}" if text and job.status is State.COMPLETED else text


def job_table(rows: list[JobRecord], now: datetime) -> list[str]:
    """The ``jobs`` listing: a header, then one line per job, columns sized
    to the widest value (type and queue capped), user text escaped."""
    cells = [
        [str(j.id), shown_status(j, now), shown(j.type, 40), shown(j.queue, 20), attempts_text(j),
         when(j.created_at), when(its_time(j)), shown(error_text(j, first_line_only=True), 60)]
        for j in rows
    ]  # fmt: skip
    header = ["ID", "STATUS", "TYPE", "QUEUE", "ATTEMPTS", "CREATED (UTC)", "DUE/CLAIMED/ENDED", "ERROR"]
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    return [
        "  ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in [header, *cells]
    ]


def job_page(job: JobRecord, attempts: list[AttemptRecord], now: datetime, tracebacks: bool) -> list[str]:
    """``show``'s text: a field per line, then the attempts, oldest first."""
    from jobdeck.present import not_retried, priority_text

    fields = [
        ("status", shown_status(job, now) + (f" (due {when(job.available_at)})" if job.status in CLAIMABLE else "")),
        ("type", shown(job.type)), ("queue", shown(job.queue)),
        ("priority", priority_text(job.priority)),
        ("attempts", attempts_text(job, why=True) if not_retried(job) else f"{attempts_text(job)} made / allowed"),
        ("key", shown(job.idempotency_key or "-")),
        *([("unique", shown(job.unique_key) + ("" if job.holds_unique_key(now) else " (released)"))]
          if job.unique_key else []),
        ("created", when(job.created_at)), ("updated", when(job.updated_at)),
        ("claimed", when(job.claimed_at)), ("worker", shown(job.worker_id or "-")),
        ("finished", when(job.finished_at)),
        ("payload", shown(json.dumps(job.payload, ensure_ascii=False))),
    ]  # fmt: skip
    if job.status is State.RUNNING:
        fields.append(("heartbeat", when(job.heartbeat_at)))
    if job.progress is not None or job.progress_message:
        fields.append(("progress", f"{job.progress or 0:.0%} {shown(job.progress_message or '')}".rstrip()))
    if job.result is not None:
        fields.append(("result", shown(json.dumps(job.result, ensure_ascii=False))))
    if job.error:
        fields.append(("error", shown(error_text(job))))
    lines = [f"job {job.id}"] + [f"  {name:<10} {value}" for name, value in fields]
    lines.append(f"attempts ({len(attempts)}):" if attempts else "attempts: none yet")
    for a in attempts:
        took = f"{a.duration:.3f} s" if a.duration is not None else "-"
        lines.append(
            f"  #{a.attempt:<3} {a.outcome.value:<11} {when(a.started_at)}  {took:>10}  {shown(a.worker_id or '-')}"
        )
        if a.error:
            lines.append(f"       {shown(a.error)}")
        if tracebacks and a.traceback:
            lines.extend(f"       {shown(line)}" for line in a.traceback.rstrip("\n").split("\n"))
    return lines
