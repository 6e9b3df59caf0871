"""Schedule health: a dead man's switch per schedule.

Config (on a ``[[schedules]]`` entry, or a runtime schedule)::

    expect_success_within = "26h"   # alert when no run succeeded for this long
    alert_after_failures = 2        # alert when this many runs in a row failed

``check_once(now)`` (every second, in the scheduler) looks at each watched,
enabled, unpaused schedule: its last success (kept in ``schedule_health``, so
it outlives retention) and its recent runs. No success within the window
covers every way a nightly job goes quiet: a fire time missed while Jobdeck
was down (no run at all), a run still pending or running, a run that failed
or went dead. A workflow schedule's run is judged by its whole workflow
(``jobdeck.store.schedules.workflow_runs``): it succeeded when every job
completed, failed while one waits for a retry, and is dead when one is
dead (also while that holds the rest). The first check that finds a schedule unhealthy records it, the
first one that finds a success after that records the recovery: each is a
conditional UPDATE, so of several processes exactly one wins each flip.

With ``[alerts] webhook_url`` set, each flip becomes one webhook message
(``event`` ``schedule.unhealthy`` then ``schedule.recovered``) delivered as a
``jobdeck.alert`` job like the dead-letter alerts, so it is retried while the
webhook is down. The job is keyed by the schedule and the success the episode
counts from, and enqueued *before* the flip: a process that dies in between
leaves the flip to the next check, whose enqueue finds the same job. However
many runs fail in one episode, it is one alert and one recovery.

Each message is its own job with its own retries, so while the webhook is
down an alert, its recovery and the next episode's alert could otherwise
arrive in any order. The job therefore checks, when it runs, that its
message is still the schedule's newest (``superseded``): an alert whose
episode has since recovered or been followed by a newer one (or whose
schedule has succeeded since), or a recovery followed by a newer episode, is
not sent, and its job completes with ``{"sent": false, "reason":
"superseded by ..."}``. The newest message is sent (retried like any alert).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.errors import IdempotencyConflict
from jobdeck.core.states import State
from jobdeck.core.validation import stored_time
from jobdeck.maintenance.schedule_entries import words
from jobdeck.store import NewJob
from jobdeck.store.schedule_health import (
    HealthRow,
    RunOutcome,
    health_rows,
    mark_recovered,
    mark_unhealthy,
    note_success,
    read_health,
    recent_outcomes,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobdeck.maintenance.alerts import AlertSettings
    from jobdeck.maintenance.schedule_entries import Schedule
    from jobdeck.store import Store
    from jobdeck.store.schedules import WorkflowRun

log = logging.getLogger("jobdeck.schedule_health")

UNHEALTHY = "schedule.unhealthy"
RECOVERED = "schedule.recovered"
_FAILED = frozenset({State.FAILED.value, State.DEAD.value})
_IN_FLIGHT = frozenset({State.PENDING.value, State.RUNNING.value})


@dataclass(frozen=True)
class Verdict:
    """What one check found for one schedule."""

    last_success: datetime | None
    episode: datetime
    """The success (or the start of watching) the current stretch counts from."""
    problem: str | None


def judge(s: Schedule, row: HealthRow, runs: list[RunOutcome], now: datetime) -> Verdict:
    """Healthy or not, and why, from the schedule's options and its runs."""
    successes = [r.finished_at for r in runs if r.status == State.COMPLETED.value and r.finished_at]
    known = [t for t in (row.last_success_at, *successes) if t is not None]
    last_success = max(known) if known else None
    episode = last_success or row.watched_since
    if s.alert_after_failures:
        failed: list[RunOutcome] = []
        for r in runs:
            if r.status == State.COMPLETED.value or r.status is None:
                break
            if r.status in _FAILED:
                failed.append(r)
        if len(failed) >= s.alert_after_failures:
            first = failed[0]
            problem = f"the last {len(failed)} runs failed; latest #{first.job_id}: {_short(first.error)}"
            return Verdict(last_success, episode, problem)
    if s.expect_success_within and now - episode > timedelta(seconds=s.expect_success_within):
        head = f"no successful run within {words(s.expect_success_within)}"
        latest = runs[0] if runs and runs[0].status != State.COMPLETED.value else None
        if latest is not None and latest.fire_time <= episode and latest.status not in _IN_FLIGHT:
            latest = None  # an old outcome, from before this stretch: the fires since were missed
        why = _about(latest, episode)
        if latest is not None and latest.status in _IN_FLIGHT:
            prior = next((r for r in runs[1:] if r.status not in _IN_FLIGHT), None)
            if prior is not None and prior.status in _FAILED:
                why += f"; before it, {_about(prior, episode)}"
        return Verdict(last_success, episode, f"{head}: {why}")
    return Verdict(last_success, episode, None)


def with_workflow_outcomes(store: Store, runs: dict[str, list[RunOutcome]]) -> dict[str, list[RunOutcome]]:
    """``runs`` with each run that started a workflow judged by its workflow."""
    from jobdeck.store.schedules import workflow_runs

    started = workflow_runs(store, [r.job_id for rs in runs.values() for r in rs])
    if not started:
        return runs
    return {name: [_as_workflow(r, started.get(r.job_id or 0)) for r in rs] for name, rs in runs.items()}


def _as_workflow(run: RunOutcome, workflow: WorkflowRun | None) -> RunOutcome:
    if workflow is None:
        return run
    return dataclasses.replace(run, status=workflow.status, error=workflow.error,
                               finished_at=workflow.finished_at, claimed_at=workflow.claimed_at)  # fmt: skip


def _about(run: RunOutcome | None, episode: datetime) -> str:
    if run is None:
        return f"no run fired since {_iso(episode)} (a missed fire: was Jobdeck down?)"
    if run.status == State.PENDING.value:
        return f"run #{run.job_id} (fired {_iso(run.fire_time)}) is still waiting to start"
    if run.status == State.RUNNING.value:
        return f"run #{run.job_id} is still running (since {_iso(run.claimed_at or run.fire_time)})"
    if run.status == State.FAILED.value:
        return f"run #{run.job_id} failed and waits for a retry: {_short(run.error)}"
    if run.status == State.DEAD.value:
        return f"run #{run.job_id} is dead: {_short(run.error)}"
    if run.status is None:
        return f"the last run (fired {_iso(run.fire_time)}) was pruned by retention"
    return f"run #{run.job_id} is {run.status}"


def _short(error: str | None) -> str:
    text = (error or "no error message").strip().splitlines()[-1:] or ["no error message"]
    return text[0][:300]


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ScheduleHealth:
    """The dead man's switch of the schedules (config and runtime) that
    ``schedules`` returns, alerting through the webhook of ``alerts``."""

    def __init__(self, store: Store, schedules: Callable[[], dict[str, Schedule]], alerts: AlertSettings) -> None:
        self.store = store
        self.schedules = schedules
        self.alerts = alerts

    def watched(self) -> list[Schedule]:
        return [
            s for s in self.schedules().values() if s.enabled and (s.expect_success_within or s.alert_after_failures)
        ]

    def check_once(self, now: datetime) -> list[tuple[str, str]]:
        """Check every watched schedule; returns the flips this call won as
        (event, schedule name)."""
        from jobdeck.store.schedules import schedule_states

        watched = self.watched()
        if not watched:
            return []
        names = [s.name for s in watched]
        states = schedule_states(self.store, names, now)
        rows = health_rows(self.store, names, now)
        runs = with_workflow_outcomes(self.store, recent_outcomes(self.store, names))
        won: list[tuple[str, str]] = []
        for s in watched:
            if states[s.name][0]:
                continue  # paused by an operator: silence is expected
            row = rows[s.name]
            verdict = judge(s, row, runs[s.name], now)
            if verdict.last_success and (row.last_success_at is None or verdict.last_success > row.last_success_at):
                note_success(self.store, s.name, verdict.last_success)
            if row.unhealthy and row.episode is not None:
                if verdict.last_success and verdict.last_success > row.episode:
                    text = f"schedule {s.name} recovered: a run succeeded at {_iso(verdict.last_success)}"
                    self._send(RECOVERED, s.name, row.episode, text, now)
                    if mark_recovered(self.store, s.name, row.episode, now):
                        log.info("%s", text)
                        won.append((RECOVERED, s.name))
            elif not row.unhealthy and verdict.problem:
                text = f"schedule {s.name} is unhealthy: {verdict.problem}"
                self._send(UNHEALTHY, s.name, verdict.episode, text, now, verdict.problem)
                if mark_unhealthy(self.store, s.name, verdict.episode, verdict.problem, now):
                    log.error("%s", text)
                    won.append((UNHEALTHY, s.name))
        return won

    def _send(
        self, event: str, name: str, episode: datetime, text: str, now: datetime, reason: str | None = None
    ) -> None:
        """Enqueue the webhook message (when one is configured), keyed so that
        every process checking at once enqueues the same one job."""
        settings = self.alerts
        if not settings.webhook_url:
            return
        from jobdeck.maintenance.alerts import ALERT_QUEUE, ALERT_TYPE

        body = {
            "event": event,
            "schedule": name,
            "reason": reason,
            "since": _iso(episode),
            "at": _iso(now),
            "dashboard": f"{settings.dashboard_url}/schedules",
            "text": text,
        }
        who = name if len(name) <= 150 else "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        stamp = episode.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        new = NewJob(
            type=ALERT_TYPE,
            payload={"body": body, "episode": episode.astimezone(UTC).isoformat()},
            queue=ALERT_QUEUE,
            priority=20,
            max_retries=settings.max_retries,
            idempotency_key=f"{event}:{who}:{stamp}",
            available_at=now,
        )
        # Another process may have enqueued this flip's message first, its "at" a moment apart: one message.
        with contextlib.suppress(IdempotencyConflict):
            self.store.enqueue(new, now)

    def superseded(self, payload: dict[str, Any]) -> str | None:
        """Why the alert job's message (``payload``, as ``_send`` made it) is
        no longer its schedule's newest, or None to send it. Episodes only
        move forward (each counts from a later success), and a flip comes
        after its message is enqueued, so a row ahead of the message means a
        newer message exists (or, for an alert, a success ended the episode)."""
        body = payload.get("body")
        if not isinstance(body, dict) or body.get("event") not in (UNHEALTHY, RECOVERED):
            return None
        name, episode = body.get("schedule"), stored_time(payload.get("episode"))
        if not isinstance(name, str) or not 0 < len(name) <= 10_000 or "\x00" in name or episode is None:
            return None  # not one of ours, or enqueued before messages carried their episode: send it
        row = read_health(self.store, [name]).get(name)
        if row is None:
            return None  # the schedule is gone: nothing to compare with
        if row.episode is not None and row.episode > episode:
            now = UNHEALTHY if row.unhealthy else RECOVERED
            return f"superseded by {now} (the episode since {_iso(row.episode)})"
        if body["event"] == UNHEALTHY and row.episode == episode and not row.unhealthy:
            return f"superseded by {RECOVERED} at {_iso(row.changed_at or episode)}"
        if body["event"] == UNHEALTHY and row.last_success_at is not None and row.last_success_at > episode:
            return f"superseded by a successful run at {_iso(row.last_success_at)}"
        return None

    def view(self) -> dict[str, dict[str, Any]]:
        """The health of every watched schedule, for the Schedules page and API."""
        watched = {s.name: s for s in self.watched()}
        rows = read_health(self.store, list(watched))
        out: dict[str, dict[str, Any]] = {}
        for name, s in watched.items():
            row = rows.get(name)
            out[name] = {
                "watched": True,
                "healthy": not (row and row.unhealthy),
                "reason": row.reason if row and row.unhealthy else None,
                "unhealthy_since": row.changed_at if row and row.unhealthy else None,
                "last_success": row.last_success_at if row else None,
                "expect_success_within": s.expect_success_within,
                "alert_after_failures": s.alert_after_failures,
            }
        return out
