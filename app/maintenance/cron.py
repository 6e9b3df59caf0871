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

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from jobdeck import actions
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import JobdeckError
from jobdeck.core.validation import check_text, parse_priority
from jobdeck.jobs.workflows import parse_workflow
from jobdeck.maintenance.crontab import make_trigger
from jobdeck.maintenance.schedule_health import MAX_SECONDS, parse_health_options
from jobdeck.store import JobRecord, NewJob
from jobdeck.store.graph import EnqueuedWorkflow
from jobdeck.store.schedules import (
    Fire,
    record_fires,
    record_manual_run,
    schedule_history,
    schedule_states,
    set_schedule_paused,
)

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck

log = logging.getLogger("jobdeck.schedules")

ON_TIME = timedelta(seconds=15)
"""A fire time found later than this is a misfire (the process was down)."""
MISFIRE_POLICIES = ("run_once", "skip")
_KEYS = {"name", "cron", "timezone", "type", "workflow", "payload", "priority", "queue", "max_retries", "enabled",
         "misfire", "misfire_grace", "expect_success_within", "alert_after_failures"}  # fmt: skip
_JOB_ONLY = ("payload", "priority", "queue", "max_retries")
"""Keys of a job schedule that a workflow schedule leaves to its workflow's jobs."""
MAX_NAME_CHARS = 200
MAX_CRON_CHARS = 200


class UnknownSchedule(JobdeckError):
    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    timezone: str
    type: str | None
    """The job type fired, or None for a workflow schedule."""
    payload: dict[str, Any]
    priority: int | str | None = None
    queue: str | None = None
    max_retries: int | None = None
    enabled: bool = True
    misfire: str = "run_once"
    misfire_grace: float = 3600.0
    expect_success_within: float | None = None
    """Seconds: alert when no run succeeded for this long (``jobdeck.maintenance.schedule_health``)."""
    alert_after_failures: int | None = None
    """Alert when this many runs in a row failed."""
    trigger: CronTrigger = field(default=None, compare=False, repr=False)
    workflow: str | None = None
    """The ``[workflows.NAME]`` fired instead of a job type."""

    def next_fire(self, after: datetime) -> datetime | None:
        """The first fire time strictly after ``after``, in UTC."""
        nxt = self.trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
        return None if nxt is None else nxt.astimezone(UTC)

    def fire_times(self, after: datetime, until: datetime) -> list[datetime]:
        """Fire times in (after, until]."""
        found: list[datetime] = []
        cursor = after
        while (nxt := self.next_fire(cursor)) is not None and nxt <= until:
            found.append(nxt)
            cursor = nxt
        return found

    def due(self, after: datetime, now: datetime) -> list[datetime]:
        """The fire times in (after, now] to enqueue under the misfire policy:
        on-time ones always; of the late ones (missed while down) none with
        ``skip``, the latest one within ``misfire_grace`` with ``run_once``."""
        window = max(ON_TIME, timedelta(seconds=self.misfire_grace))
        fires = self.fire_times(max(after, now - window), now)
        on_time = [f for f in fires if now - f <= ON_TIME]
        late = [f for f in fires if now - f > ON_TIME]
        catch_up = late and self.misfire == "run_once" and not on_time
        if catch_up and now - late[-1] <= timedelta(seconds=self.misfire_grace):
            return [late[-1]]
        if late:
            log.warning("schedule %s: skipped %d missed fire time(s), last %s", self.name, len(late), late[-1])
        return on_time

    def job_data(self, key: str) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "payload": self.payload, "idempotency_key": key}
        for name in ("priority", "queue", "max_retries"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    def describe(self) -> str:
        """The cron in words, with its time zone: "every day at 02:00 UTC"."""
        fields = self.cron.split()
        if len(fields) == 5 and fields[0].isdigit() and fields[1].isdigit() and fields[2:] == ["*", "*", "*"]:
            return f"every day at {int(fields[1]):02d}:{int(fields[0]):02d} {self.timezone}"
        from cron_descriptor import ExpressionDescriptor, Options  # 4 MB that only the pages and the CLI need

        options = Options()
        options.use_24hour_time_format = True
        try:
            words = ExpressionDescriptor(self.cron, options).get_description()
        except Exception:  # cron_descriptor reads fewer forms than APScheduler accepts
            return f"{self.cron} ({self.timezone})"
        return f"{words[:1].lower()}{words[1:]} ({self.timezone})"


def fire_key(name: str, fire_time: datetime) -> str:
    return f"schedule:{name}:{fire_time.astimezone(UTC).isoformat()}"


def parse_schedules(raw: Any, deck: Jobdeck) -> list[Schedule]:
    """Validate the ``[[schedules]]`` array; a bad entry stops start-up with a
    ConfigError naming the schedule and the problem."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError("schedules: expected an array of tables ([[schedules]])")
    found: list[Schedule] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        schedule = parse_schedule(entry, deck, f"schedules[{i}]")
        if schedule.name in seen:
            raise ConfigError(f"schedule {schedule.name!r}: the name is used twice")
        seen.add(schedule.name)
        found.append(schedule)
    return found


def parse_schedule(entry: Any, deck: Jobdeck, label: str = "schedule") -> Schedule:
    """One schedule entry, validated: the rule for config schedules and for
    the ones made at runtime (``jobdeck.maintenance.runtime_schedules``). A bad
    entry raises ConfigError naming the schedule and the problem."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{label}: expected a table")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ConfigError(f"{label}: name: required, a string of 1 to {MAX_NAME_CHARS} characters")
    if not name.isprintable():
        raise ConfigError(f"{label}: name: must not contain control characters (NUL, newlines, ...)")
    where = f"schedule {name!r}"
    try:
        check_text(name, "name", MAX_NAME_CHARS)
    except JobdeckError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    unknown = sorted(set(entry) - _KEYS, key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown key {str(unknown[0])[:80]!r}")
    tz_name = entry.get("timezone", "UTC")
    if not isinstance(tz_name, str) or not tz_name or len(tz_name) > 100:
        raise ConfigError(f"{where}: timezone: expected an IANA zone name such as 'Europe/Paris'")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(f"{where}: unknown timezone {tz_name!r}") from None
    cron = entry.get("cron")
    if not isinstance(cron, str) or len(cron) > MAX_CRON_CHARS:
        raise ConfigError(f'{where}: cron: required, a string of at most {MAX_CRON_CHARS} characters, e.g. "0 2 * * *"')
    if not cron.isascii():  # int() reads "٣" as 3: a look-alike digit would fire at a time nobody wrote
        raise ConfigError(f"{where}: invalid cron expression {cron!r}: ASCII digits, letters and * / , - only")
    try:
        trigger = make_trigger(cron, tz)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise ConfigError(f"{where}: invalid cron expression {cron!r}: {exc}") from None
    if trigger.get_next_fire_time(None, datetime.now(UTC)) is None:
        # Refused once here: every tick and page would pay APScheduler's search to year 9999 again.
        raise ConfigError(f"{where}: cron {cron!r} never fires (a date that does not exist, such as 30 February)")
    job_type, workflow = entry.get("type"), entry.get("workflow")
    if (job_type is None) == (workflow is None):
        raise ConfigError(f"{where}: give exactly one of type (a job type) or workflow (a [workflows.NAME])")
    if workflow is not None:
        if not isinstance(workflow, str) or workflow not in deck.configured_workflows:
            raise ConfigError(f"{where}: workflow: no [workflows.{str(workflow)[:200]}] in the config")
        given = [k for k in _JOB_ONLY if k in entry]
        if given:
            raise ConfigError(f"{where}: {given[0]}: not allowed with workflow (set it on the workflow's jobs)")
    elif not isinstance(job_type, str) or not deck.known_type(job_type):
        raise ConfigError(f"{where}: unknown job type {str(job_type)[:200]!r} (no handler registered)")
    misfire = entry.get("misfire", "run_once")
    if misfire not in MISFIRE_POLICIES:
        raise ConfigError(f"{where}: misfire: must be one of {', '.join(MISFIRE_POLICIES)}, got {misfire!r}")
    grace = entry.get("misfire_grace", 3600)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= MAX_SECONDS:
        raise ConfigError(f"{where}: misfire_grace: must be a number of seconds >= 0")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: enabled: must be true or false")
    within, failures = parse_health_options(entry, where)
    schedule = Schedule(
        name=name, cron=cron, timezone=tz_name, type=job_type, payload=entry.get("payload", {}),
        priority=entry.get("priority"), queue=entry.get("queue"), max_retries=entry.get("max_retries"),
        enabled=enabled, misfire=misfire, misfire_grace=float(grace), expect_success_within=within,
        alert_after_failures=failures, trigger=trigger, workflow=workflow,
    )  # fmt: skip
    if workflow is not None:
        return schedule  # its jobs were checked with [workflows.NAME]
    try:
        parse_priority(schedule.priority)
        deck.new_job(schedule.job_data(fire_key(name, datetime.now(UTC))), datetime.now(UTC))
    except JobdeckError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return schedule


class Periodic:
    """The schedules of one deck, from config and made at runtime (in the
    database, reloaded within ``poll_interval``), and their state in the database."""

    def __init__(self, deck: Jobdeck, schedules: list[Schedule]) -> None:
        self.deck = deck
        self.store = deck.store
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

        if not force and time.monotonic() - self._loaded_at < self.deck.config.poll_interval:
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
                runtime[name] = parse_schedule(entry, self.deck)
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
        jobs = [(s, f) for s, f in fires if s.workflow is None]
        ids: list[int] = []
        if jobs:
            news = [self.deck.new_job(s.job_data(fire_key(s.name, f)), now) for s, f in jobs]
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
        news = [parse_workflow(self.deck, self.deck.configured_workflows[str(s.workflow)], key=fire_key(s.name, f))
                for s, f in fires]  # fmt: skip
        return self.store.enqueue_workflows(news, now)

    def _states(self, now: datetime) -> dict[str, tuple[bool, datetime]]:
        return schedule_states(self.store, list(self.schedules), now)

    # -- operator actions -------------------------------------------------------

    def run_now(self, name: str, now: datetime, actor: str) -> JobRecord:
        """Enqueue one run at once, outside the cron (paused or not); for a
        workflow schedule, the workflow, answered with its first job."""
        s = self.get(name)
        key = f"schedule:{name}:manual:{now.isoformat()}"
        if s.workflow is not None:
            job = self.store.get(first_job(self.deck.enqueue_named_workflow(s.workflow, key=key)))
        else:
            new: NewJob = self.deck.new_job(s.job_data(key), now)
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
        health = self.deck.schedule_health.view()
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


def definition(s: Schedule) -> dict[str, Any]:
    """A schedule as its config entry (what a runtime schedule's edit form shows)."""
    entry: dict[str, Any] = {"name": s.name, "cron": s.cron, "timezone": s.timezone, "enabled": s.enabled,
                             "misfire": s.misfire, "misfire_grace": s.misfire_grace}  # fmt: skip
    if s.workflow is not None:
        entry["workflow"] = s.workflow
    else:
        entry.update(type=s.type, payload=s.payload)
    for key in ("priority", "queue", "max_retries", "expect_success_within", "alert_after_failures"):
        if getattr(s, key) is not None:
            entry[key] = getattr(s, key)
    return entry


def first_job(workflow: EnqueuedWorkflow) -> int:
    """The job a workflow's schedule run is kept under: its first (lowest id);
    the run's outcome is read from the whole workflow (``jobdeck.store.schedules``)."""
    return min(workflow.jobs.values())
