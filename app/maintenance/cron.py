"""Recurring jobs declared in config, enqueued through the normal queue.

Config::

    [[schedules]]
    name = "sales-report"
    cron = "0 2 * * *"          # five fields; a sixth, leading, seconds field is allowed
    timezone = "UTC"            # any IANA zone; cron fields are read in it
    type = "reports.sales"
    payload = {region = "emea"}
    misfire = "run_once"        # or "skip"
    misfire_grace = 3600        # seconds (run_once only)
    expect_success_within = "26h"   # schedule health: alert when no run succeeded for this long
    alert_after_failures = 2        # ... or when this many runs in a row failed

A schedule fires a job type or, with ``workflow = "NAME"`` instead of
``type``, a workflow declared as ``[workflows.NAME]`` (``jobdeck.jobs.workflows``);
a workflow schedule takes no payload, priority, queue or max_retries (its
jobs carry their own).

Each fire time becomes a one-off job with the idempotency key
``schedule:<name>:<fire time in UTC, ISO 8601>``, or a workflow with that
``key``: the database's UNIQUE key is what makes any number of processes
running this loop produce one job (or workflow) per fire time (no leader
election). The loop body is ``enqueue_due_once(now)``; the operator's pause
flag and the watermark ``checked_until`` live in the ``schedule_state``
table, and each firing is kept in ``schedule_runs`` (a workflow's under its
first job).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jobdeck import actions
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import JobdeckError
from jobdeck.maintenance.schedule_entries import (
    Schedule,
    Targets,
    UnknownSchedule,
    definition,
    fire_key,
    log,
    parse_schedule,
    parse_schedules,
)
from jobdeck.store import JobRecord, NewJob, Store
from jobdeck.store.graph import EnqueuedWorkflow, NewWorkflow
from jobdeck.store.schedules import (
    Fire,
    record_fires,
    record_manual_run,
    schedule_history,
    schedule_states,
    set_schedule_paused,
)

__all__ = ["Periodic", "Schedule", "Targets", "UnknownSchedule", "definition", "fire_key", "first_job",
           "parse_schedule", "parse_schedules"]  # fmt: skip

HealthView = Callable[[], dict[str, dict[str, Any]]]
"""Every watched schedule's health, by name (``ScheduleHealth.view``)."""


def no_health() -> dict[str, dict[str, Any]]:
    return {}


class Periodic:
    """The schedules of one store, from config and made at runtime (in the
    database, reloaded within ``poll_interval``), and their state in the
    database. ``targets`` checks and builds what they fire; ``health`` gives
    their health for the overview."""

    def __init__(
        self,
        store: Store,
        schedules: list[Schedule],
        targets: Targets,
        poll_interval: float,
        health: HealthView = no_health,
    ) -> None:
        self.store = store
        self.targets = targets
        self.poll_interval = poll_interval
        self.health = health
        self.configured: dict[str, Schedule] = {s.name: s for s in schedules}
        self.runtime: dict[str, Schedule] = {}
        self.invalid: dict[str, str] = {}
        """Runtime schedules that no longer parse (e.g. their handler is gone): name -> why."""
        self._stored: dict[str, dict[str, Any]] = {}
        self._loaded_at = -math.inf

    @property
    def schedules(self) -> dict[str, Schedule]:
        """Every schedule this process fires: config first, then runtime ones."""
        return {**self.configured, **self.runtime}

    def all(self) -> dict[str, Schedule]:
        """``schedules`` after picking up runtime changes made by any process."""
        self.refresh()
        return self.schedules

    def refresh(self, force: bool = False) -> None:
        """Pick up the runtime schedules' changes (read at most once per
        ``poll_interval`` unless ``force``; only changed ones are parsed again).
        One that no longer parses is kept out and listed in ``invalid``."""
        from jobdeck.store.runtime_schedules import load_runtime_schedules

        if not force and time.monotonic() - self._loaded_at < self.poll_interval:
            return
        self._loaded_at = time.monotonic()
        stored = {s.name: s.definition for s in load_runtime_schedules(self.store) if s.name not in self.configured}
        if stored == self._stored:
            return
        runtime: dict[str, Schedule] = {}
        invalid: dict[str, str] = {}
        for name, entry in stored.items():
            if self._stored.get(name) == entry and name in self.runtime:
                runtime[name] = self.runtime[name]
                continue
            try:
                runtime[name] = parse_schedule(entry, self.targets)
            except ConfigError as exc:
                invalid[name] = str(exc)
                if name not in self.invalid:
                    log.warning("runtime schedule %s is not fired: %s", name, exc)
        changed = sorted(n for n in set(stored) | set(self._stored) if stored.get(n) != self._stored.get(n))
        log.info("runtime schedules picked up: %d in all; changed: %s", len(stored), ", ".join(changed)[:500])
        self.runtime, self.invalid, self._stored = runtime, invalid, stored

    def get(self, name: str) -> Schedule:
        try:
            return self.all()[name]
        except KeyError:
            raise UnknownSchedule(name) from None

    # -- the loop body ----------------------------------------------------------

    def enqueue_due_once(self, now: datetime) -> list[int]:
        """Enqueue every due fire time of every enabled, unpaused schedule;
        returns the ids of the jobs for them (a workflow's first job; new or
        already enqueued by another process). A schedule seen for the first
        time starts at ``now``."""
        if not self.all():
            return []
        states = self._states(now)
        fires: list[tuple[Schedule, datetime]] = []
        passed: list[str] = []
        for s in self.schedules.values():
            paused, checked_until = states[s.name]
            if not s.enabled or paused or checked_until >= now:
                continue
            nxt = s.next_fire(checked_until)
            if nxt is not None and nxt <= now:  # a fire time passed: enqueue or skip it, then move on
                passed.append(s.name)
                fires.extend((s, f) for f in s.due(checked_until, now))
        if not passed:
            return []  # nothing to write: most ticks end here
        fires.sort(key=lambda fire: fire[0].workflow is not None)  # the jobs, then the workflows
        jobs, news = self._new_jobs([(s, f) for s, f in fires if s.workflow is None], now)
        fires = jobs + [(s, f) for s, f in fires if s.workflow is not None]
        ids: list[int] = []
        if jobs:
            ids = self.store.enqueue_many(news, now)
        if len(jobs) < len(fires):
            ids += [first_job(w) for w in self._enqueue_workflows(fires[len(jobs) :], now)]
        record_fires(self.store, [Fire(s.name, f, i) for (s, f), i in zip(fires, ids)], passed, now)
        for (s, f), i in zip(fires, ids):
            log.info("schedule %s fired for %s: job %s", s.name, f.isoformat(), i)
        return ids

    def _enqueue_workflows(self, fires: list[tuple[Schedule, datetime]], now: datetime) -> list[EnqueuedWorkflow]:
        """One workflow per fire, keyed by the fire as a job would be: two
        processes firing the same time make one (the UNIQUE key decides,
        ``Graph.enqueue_workflows``)."""
        news = [self._new_workflow(s, f, fire_key(s.name, f)) for s, f in fires]
        return self.store.enqueue_workflows(news, now)

    def _new_jobs(
        self, fires: list[tuple[Schedule, datetime]], now: datetime
    ) -> tuple[list[tuple[Schedule, datetime]], list[NewJob]]:
        """The fires' jobs, each checked again as an enqueue: a check that held
        when the schedule was read (a typed payload's own) may refuse one now,
        and that fire is skipped, said in the log, instead of every schedule's."""
        kept, news = [], []
        for s, f in fires:
            try:
                news.append(self._new_job(s, f, fire_key(s.name, f), now))
            except JobdeckError as exc:
                log.error("schedule %s: its fire for %s is not enqueued: %s", s.name, f.isoformat(), exc)
                continue
            kept.append((s, f))
        return kept, news

    def _new_job(self, s: Schedule, fire: datetime, key: str, now: datetime) -> NewJob:
        with self.targets.fire_span(s.name, fire):
            return self.targets.new_job(s.job_data(key), now)

    def _new_workflow(self, s: Schedule, fire: datetime, key: str) -> NewWorkflow:
        with self.targets.fire_span(s.name, fire):
            return self.targets.new_workflow(str(s.workflow), key)

    def _states(self, now: datetime) -> dict[str, tuple[bool, datetime]]:
        return schedule_states(self.store, list(self.schedules), now)

    # -- operator actions -------------------------------------------------------

    def run_now(self, name: str, now: datetime, actor: str) -> JobRecord:
        """Enqueue one run at once, outside the cron (paused or not); for a
        workflow schedule, the workflow, answered with its first job."""
        s = self.get(name)
        key = f"schedule:{name}:manual:{now.isoformat()}"
        if s.workflow is not None:
            [enqueued] = self.store.enqueue_workflows([self._new_workflow(s, now, key)], now)
            job = self.store.get(first_job(enqueued))
        else:
            new: NewJob = self._new_job(s, now, key, now)
            job, _ = self.store.enqueue(new, now)
        record_manual_run(self.store, name, job.id, now)
        actions.record(actor, "schedule.run", name, now, store=self.store, job_id=job.id)
        return job

    def set_paused(self, name: str, paused: bool, now: datetime, actor: str) -> None:
        """Pause or resume. Resuming does not replay the fire times missed while
        paused: the watermark moves to ``now``."""
        self.get(name)
        self._states(now)
        set_schedule_paused(self.store, name, paused, now)
        actions.record(actor, "schedule.pause" if paused else "schedule.resume", name, now, store=self.store)

    # -- reads ------------------------------------------------------------------

    def overview(self, now: datetime, recent: int = 10) -> list[dict[str, Any]]:
        """Every schedule (config, then runtime) with its source, next run,
        last runs and their outcomes, and its health; then schedules removed
        that left history."""
        schedules = self.all()
        paused, history = schedule_history(self.store, list(schedules) + sorted(self.invalid), recent)
        health = self.health()
        out: list[dict[str, Any]] = []
        for name, runs in history.items():
            s = schedules.get(name)
            is_paused = paused.get(name, False)
            source = "config" if name in self.configured else "runtime" if s or name in self.invalid else None
            out.append({
                "name": name,
                "configured": s is not None,
                "source": source,
                "cron": s.cron if s else None,
                "description": s.describe() if s else self.invalid.get(name, "removed"),
                "timezone": s.timezone if s else None,
                "type": s.type if s else None,
                "workflow": s.workflow if s else None,
                "enabled": bool(s and s.enabled),
                "paused": is_paused,
                "next_run": s.next_fire(now) if s and s.enabled and not is_paused else None,
                "runs": [{**r, "status": r["status"] if r["status"] is not None else "pruned"} for r in runs],
                "health": health.get(name, {"watched": False, "healthy": True}),
                "definition": definition(s) if s is not None and source == "runtime" else None,
            })  # fmt: skip
        return out


def first_job(workflow: EnqueuedWorkflow) -> int:
    """The job a workflow's schedule run is kept under: its first (lowest id);
    the run's outcome is read from the whole workflow (``jobdeck.store.schedules``)."""
    return min(workflow.jobs.values())
