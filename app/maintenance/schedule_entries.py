"""A schedule as the config (``[[schedules]]``) or the API writes it:
parsed and checked once, with its cron trigger, its misfire policy and its
fire times. What it fires is checked as every new job is, through
``Targets``, which the schedules are given when they are built."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import JobdeckError
from jobdeck.core.validation import check_text, parse_priority
from jobdeck.maintenance.crontab import make_trigger

if TYPE_CHECKING:
    from jobdeck.store import NewJob
    from jobdeck.store.graph import NewWorkflow

log = logging.getLogger("jobdeck.schedules")

MAX_SECONDS = 10 * 365 * 86400
MAX_FAILURES = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([smhdw]))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")

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
        from cron_descriptor import ExpressionDescriptor, Options  # loaded here: only the pages and the CLI need it

        options = Options()
        options.use_24hour_time_format = True
        try:
            words = ExpressionDescriptor(self.cron, options).get_description()
        except Exception:  # cron_descriptor reads fewer forms than APScheduler accepts
            return f"{self.cron} ({self.timezone})"
        return f"{words[:1].lower()}{words[1:]} ({self.timezone})"


def fire_key(name: str, fire_time: datetime) -> str:
    return f"schedule:{name}:{fire_time.astimezone(UTC).isoformat()}"


def parse_duration(value: Any, key: str) -> float:
    """Seconds from a number or a string such as ``"26h"``, ``"90m"``,
    ``"1h30m"``, ``"3s"``, ``"2d"``; more than 0 and at most ten years."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f'{key}: expected a duration such as "26h", "90m" or a number of seconds')
    if isinstance(value, str):
        text = value.strip().lower()
        if len(text) > 40 or not _DURATION.fullmatch(text):
            raise ConfigError(f'{key}: expected a duration such as "26h", "90m" or "1h30m", got {value[:40]!r}')
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        seconds = float(value)
    if not 0 < seconds <= MAX_SECONDS:
        raise ConfigError(f"{key}: must be more than 0 seconds and at most ten years")
    return seconds


def parse_health_options(entry: dict[str, Any], where: str) -> tuple[float | None, int | None]:
    """A schedule entry's ``expect_success_within`` (seconds) and ``alert_after_failures``."""
    within = entry.get("expect_success_within")
    seconds = None if within is None else parse_duration(within, f"{where}: expect_success_within")
    failures = entry.get("alert_after_failures")
    if failures is not None and (
        isinstance(failures, bool) or not isinstance(failures, int) or not 1 <= failures <= MAX_FAILURES
    ):
        raise ConfigError(f"{where}: alert_after_failures: must be a whole number from 1 to {MAX_FAILURES}")
    return seconds, failures


def words(seconds: float) -> str:
    """A duration as a person says it: 26h, 90m, 3s, 1d2h."""
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or f"{seconds:g}s"


@dataclass(frozen=True)
class Targets:
    """What a schedule may fire and how a fire becomes a job or a workflow:
    the checks every new job passes, given to the schedules when they are built."""

    known_type: Callable[[str], bool]
    new_job: Callable[[Mapping[str, Any], datetime], NewJob]
    """A validated new job from an enqueue request (``Intake.new_job``)."""
    workflows: Mapping[str, Any]
    """The ``[workflows.NAME]`` tables of the config, checked at start-up."""
    new_workflow: Callable[[str, str], NewWorkflow]
    """The workflow ``[workflows.NAME]`` keyed ``key``: ``new_workflow(name, key)``."""
    fire_span: Callable[[str, datetime], AbstractContextManager[Any]] = lambda name, at: nullcontext()
    """What a fire's jobs are made in: with tracing on, a trace of its own
    per fire (``jobdeck.tracing.AttemptTracer.fire``); else nothing."""


def parse_schedules(raw: Any, targets: Targets) -> list[Schedule]:
    """Validate the ``[[schedules]]`` array; a bad entry stops start-up with a
    ConfigError naming the schedule and the problem."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError("schedules: expected an array of tables ([[schedules]])")
    found: list[Schedule] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        schedule = parse_schedule(entry, targets, f"schedules[{i}]")
        if schedule.name in seen:
            raise ConfigError(f"schedule {schedule.name!r}: the name is used twice")
        seen.add(schedule.name)
        found.append(schedule)
    return found


def parse_schedule(entry: Any, targets: Targets, label: str = "schedule") -> Schedule:
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
        if not isinstance(workflow, str) or workflow not in targets.workflows:
            raise ConfigError(f"{where}: workflow: no [workflows.{str(workflow)[:200]}] in the config")
        given = [k for k in _JOB_ONLY if k in entry]
        if given:
            raise ConfigError(f"{where}: {given[0]}: not allowed with workflow (set it on the workflow's jobs)")
    elif not isinstance(job_type, str) or not targets.known_type(job_type):
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
        targets.new_job(schedule.job_data(fire_key(name, datetime.now(UTC))), datetime.now(UTC))
    except JobdeckError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return schedule


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
