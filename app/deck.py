"""The Jobdeck facade: config + store + handler registry, and the validated
way in for new jobs (shared by the API, the CLI and Python callers).

A deck owns its parts, built (and their config checked) when it is, so a bad
schedule, queue limit, alert or retention entry stops start-up with a
ConfigError naming it: ``deck.schedules`` (the recurring jobs: configured, and made at runtime
through ``deck.runtime_schedules``), ``deck.schedule_health`` (their dead
man's switch),
``deck.queues`` (pause/resume and concurrency limits, installed as the
store's claim policy), ``deck.alerts`` (dead-letter alerts), ``deck.thresholds`` (threshold alerts),
``deck.maintenance`` (sweeper, retention, roll-up) and ``deck.health`` (what
makes this process unhealthy).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.clock import RESCUE_SKEW_FRACTION, DatabaseClock, HostClock
from jobdeck.core.config import Config, artifact_max_bytes, log_limits
from jobdeck.core.errors import InvalidField, PayloadTooLarge, TransitionRefused, UnknownType
from jobdeck.core.states import State
from jobdeck.core.validation import (
    MAX_QUEUE_CHARS,
    MAX_TYPE_CHARS,
    check_json,
    check_name,
    check_text,
    parse_priority,
    parse_time,
    spellings,
)
from jobdeck.health import Health
from jobdeck.jobs.flow import Flow, parse_flow
from jobdeck.jobs.handlers import Registry
from jobdeck.jobs.handlers import registry as default_registry
from jobdeck.jobs.queues import QueueControls, parse_limits
from jobdeck.jobs.unique import Unique, claim_for, parse_unique, parse_unique_types
from jobdeck.jobs.workflows import parse_config_workflows
from jobdeck.maintenance.alerts import Alerts, parse_alerts
from jobdeck.maintenance.cron import Periodic, parse_schedules
from jobdeck.maintenance.runtime_schedules import RuntimeSchedules
from jobdeck.maintenance.schedule_health import ScheduleHealth
from jobdeck.maintenance.thresholds import ThresholdAlerts, parse_thresholds
from jobdeck.maintenance.upkeep import Maintenance, parse_retention
from jobdeck.store import JobRecord, NewJob, Store, backoff_delay
from jobdeck.store.audit import record_action
from jobdeck.store.engine import make_engine
from jobdeck.store.enqueue import PlainJob
from jobdeck.store.lifecycle import Edited, JobChanges, Seen
from jobdeck.store.records import Enqueued
from jobdeck.store.timekeeping import database_time

if TYPE_CHECKING:
    from flask import Flask
    from jobdeck.jobs.workflows import Batch, Workflow
    from jobdeck.runtime import Runtime
    from jobdeck.store.graph import EnqueuedWorkflow

Clock = Callable[[], datetime]


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Built once: ``json.dumps`` with options builds an encoder per call. It
refuses NaN and Infinity, which are not JSON and break strict clients."""

log = logging.getLogger("jobdeck")

MAX_KEY_CHARS = 255
MAX_RETRIES = 1000
"""The most retries a job can ask for."""
MAX_DELAY_SECONDS = 10 * 365 * 86400
"""The latest a job can be delayed to: ten years."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _store_of(config: Config) -> Store:
    """The store on the configured database. On PostgreSQL the HTTP
    requests get an engine of their own whose sessions carry the request
    timeouts (``Store.bound_requests``), with ``http_threads`` of the pool
    (the rest serve the workers and maintenance)."""
    url = config.resolved_database_url()
    requests = config.http_threads if url.startswith("postgresql") else 0
    idle = max(10.0, config.stall_timeout)
    store = Store(
        make_engine(
            url,
            synchronous=config.sqlite_synchronous,
            pool_size=max(5, config.workers + config.http_threads + 4 - requests),
            busy_timeout=config.sqlite_busy_timeout,
            idle_in_transaction=idle,
        )
    )
    if requests:
        timeouts = (config.request_lock_timeout, config.request_statement_timeout)
        store.bound_requests(make_engine(url, pool_size=requests, idle_in_transaction=idle, timeouts=timeouts))
    return store


class Jobdeck:
    def __init__(
        self,
        config: Config,
        registry: Registry | None = None,
        clock: Clock | None = None,
        store: Store | None = None,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else default_registry
        owned = store is None
        self.store = store if store is not None else _store_of(config)
        try:
            self._build(config, clock)
        except BaseException:
            if owned:  # a config refused at start-up leaves no connection open behind it
                self.store.engine.dispose()
            raise

    def _build(self, config: Config, clock: Clock | None) -> None:
        self.clock: Clock = self._clock_for(clock)
        """What every time this deck writes or compares comes from (``jobdeck.core.clock``)."""
        self.store.backoff = self.backoff
        self.store.artifact_max_bytes = artifact_max_bytes(config)
        self.unique_types: dict[str, Unique] = parse_unique_types(config)
        """``[types."T"] unique`` (``jobdeck.jobs.unique``), checked at start-up."""
        self.log_limits = log_limits(config)
        """``[logs]``: the caps and flush interval of per-job logs (``jobdeck.jobs.joblogs``)."""

        # Imported here: the parts import this module for Jobdeck and its parsers.

        if config.demo:
            from jobdeck.demo import add_demo_config

            add_demo_config(config)
        self.flow: Flow = Flow(parse_flow(config))
        """Rate limits and concurrency per key (``jobdeck.jobs.flow``): the enqueue computes the keys."""
        if self.flow.keyed_columns:
            self.store.flow_keys = self.flow.keys
        self.health: Health = Health()
        self.health.register(lambda: self.store.storage.problem(self.clock()))
        self.alerts: Alerts = Alerts(self, parse_alerts(config))
        self.alerts.install()  # registers jobdeck.alert before the schedules are checked against the types
        self.thresholds: ThresholdAlerts = ThresholdAlerts(self, parse_thresholds(config), self.alerts.settings)
        self.thresholds.install()
        self.configured_workflows: dict[str, dict[str, Any]] = parse_config_workflows(self)
        """``[workflows.NAME]``, checked at start-up; the schedules that fire them are checked against it."""
        self.schedules: Periodic = Periodic(self, parse_schedules(config.extra.get("schedules"), self))
        self.runtime_schedules: RuntimeSchedules = RuntimeSchedules(self)
        self.schedule_health: ScheduleHealth = ScheduleHealth(self)
        self.queues: QueueControls = QueueControls(
            self.store, parse_limits(config), refresh=config.poll_interval, flow=self.flow
        )
        self.queues.install()
        self.maintenance: Maintenance = Maintenance(self, parse_retention(config))
        self._warn_unknown_types()
        self._runtime: Runtime | None = None
        self._built_in = os.getpid()
        if isinstance(self.clock, DatabaseClock) and not self.store.sqlite:
            store = self.store  # bound last: checking the config reads the clock, and must not connect
            self.clock.read = lambda: database_time(store)

    @classmethod
    def from_config(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        registry: Registry | None = None,
        env: Mapping[str, str] | None = None,
        init_db: bool = True,
        **overrides: Any,
    ) -> Jobdeck:
        """A Jobdeck for Python callers: the config file (``path``, else
        ``JOBDECK_CONFIG`` or ./jobdeck.toml), the environment, then keyword
        overrides; its ``handler_modules`` imported and, with ``init_db``, the
        schema brought up to date. Starts nothing: a producer only enqueues,
        ``init_app`` mounts the web, ``start`` runs workers and the scheduler."""
        from jobdeck.core.config import load

        return cls.of(load(path, env, overrides), registry, init_db=init_db)

    @classmethod
    def of(cls, config: Config, registry: Registry | None = None, *, init_db: bool = True) -> Jobdeck:
        """The deck of a loaded config: its ``handler_modules`` imported, the
        demo's types registered with ``demo``, and with ``init_db`` the schema
        brought up to date. What ``create_app`` and ``jobdeck worker`` build on."""
        from jobdeck.jobs.handlers import import_modules

        registry = registry if registry is not None else default_registry
        import_modules(config.handler_modules)
        if config.demo:
            from jobdeck import demo

            demo.register(registry)
        deck = cls(config, registry)
        if init_db:
            deck.init_db()
        return deck

    def init_app(
        self,
        host: Flask,
        url_prefix: str,
        current_role: Callable[[], str | None],
        *,
        current_name: Callable[[], str | None] | None = None,
        login_url: str | None = None,
    ) -> Flask:
        """Mount the dashboard and API under ``url_prefix`` of the host Flask
        app, with the host's login deciding the role (``jobdeck.embed``); returns
        Jobdeck's own Flask app."""
        from jobdeck.embed import mount

        return mount(self, host, url_prefix, current_role, current_name=current_name, login_url=login_url)

    def start(self, *, workers: int | None = None, scheduler: bool = True) -> Runtime:
        """Start this process's worker pool (``workers`` threads, default the
        config's) and scheduler through the one runtime object; a second call
        does nothing. In a process forked after the deck was built (gunicorn's
        ``post_fork`` with ``--preload``) the inherited database connections
        are dropped first, never shared with the parent."""
        from jobdeck.runtime import Runtime

        if self._runtime is None:
            if os.getpid() != self._built_in:
                self.store.engine.dispose(close=False)
                self._built_in = os.getpid()
            self._runtime = Runtime(self, workers=workers, services=scheduler)
        self._runtime.start()
        return self._runtime

    def stop(self, grace: float | None = None) -> None:
        """Stop what ``start`` started (running jobs get ``grace`` seconds,
        default ``shutdown_grace``, then are released)."""
        if self._runtime is not None:
            self._runtime.stop(grace)
            self._runtime = None

    def init_db(self) -> None:
        """Bring the schema to the code's revision (Alembic, see jobdeck.store.migrate);
        with ``auto_migrate`` off, refuse a schema that is behind. On
        PostgreSQL, also take the first reading of the database's clock."""
        from jobdeck.store.schema import ensure_current

        ensure_current(self.store.engine, self.config.auto_migrate)
        if isinstance(self.clock, DatabaseClock):
            self.clock.measure()

    def _clock_for(self, clock: Clock | None) -> Clock:
        """The injected clock as it is; by default this host's clock on
        SQLite (one host, one clock) and the database's on PostgreSQL, each
        watching for steps larger than a quarter of ``stall_timeout``. A
        ``DatabaseClock`` given is bound to this deck's database."""
        step_limit = self.config.stall_timeout * RESCUE_SKEW_FRACTION
        if clock is None:
            if self.store.sqlite:
                return HostClock(step_limit=step_limit)
            clock = DatabaseClock(warn_after=self.config.clock_skew_warn, step_limit=step_limit)
        return clock

    # -- policy -------------------------------------------------------------

    def backoff(self, job_type: str, retry_count: int) -> float:
        """The exponential backoff (``jobdeck.store.lifecycle.backoff_delay``) with the base
        and cap from the handler's options or the config."""
        spec = self.registry.get(job_type)
        base = spec.backoff_base if spec and spec.backoff_base is not None else self.config.backoff_base
        cap = spec.backoff_cap if spec and spec.backoff_cap is not None else self.config.backoff_cap
        return backoff_delay(base, cap, retry_count)

    def type_names(self) -> list[str]:
        """Every job type this deployment accepts: registered handlers and
        ``external_types`` (served by HTTP workers)."""
        return sorted(set(self.registry.names()) | set(self.config.external_types))

    def known_type(self, name: str) -> bool:
        """Registered here or an external type, under either spelling (``spellings``)."""
        return any(n in self.registry or n in self.config.external_types for n in spellings(name))

    def _warn_unknown_types(self) -> None:
        """A ``[types."X"]`` table whose X no handler here registers and
        ``external_types`` does not list is most likely a typo: its options
        (limits, unique, snoozes, log capture) would silently never apply.
        Said at start-up; not refused, as another process may run that
        type's handler."""
        types = self.config.extra.get("types")
        for name in sorted(types) if isinstance(types, dict) else ():
            if not self.known_type(name):
                log.warning(
                    '[types."%s"]: no handler for this type is registered here and external_types does not list it;'
                    " check the name (known: %s)",
                    name,
                    ", ".join(self.type_names()[:20]) or "none",
                )

    # -- operator actions -----------------------------------------------------

    def cancel(self, job_id: int, actor: str) -> JobRecord:
        """Cancel a job, the one way the API, the dashboard and the CLI do it,
        audit-logged as done by ``actor``. Pending and failed jobs are
        ``cancelled`` at once; a running one comes back still ``running``
        with ``cancel_requested_at`` set, and ends ``cancelled`` when its
        attempt ends (``State.CANCELLED``). A refusal (``TransitionRefused``,
        ``JobNotFound``) is raised after the refused attempt is logged."""
        now = self.clock()
        try:
            job = self.store.cancel(job_id, now)
        except TransitionRefused as exc:
            record_action(self.store, actor, "cancel", now, count=0, job_id=job_id, detail=f"refused: {exc}")
            raise
        detail = "requested while running; ends when its attempt does" if job.status is State.RUNNING else None
        record_action(self.store, actor, "cancel", now, count=1, job_id=job_id, detail=detail)
        return job

    # -- edit ---------------------------------------------------------------

    def job_changes(self, data: Mapping[str, Any]) -> JobChanges:
        """Validate an edit like an enqueue: any of ``payload``, ``priority``,
        ``queue`` and ``run_at``, each checked by the rule the enqueue uses;
        raise InvalidField (or PayloadTooLarge) naming the field."""
        unknown = sorted(set(data) - set(EDITABLE))
        if unknown:
            raise InvalidField(unknown[0], f"unknown field; an edit sets {', '.join(EDITABLE)}")
        for name, value in data.items():
            if value is None:
                raise InvalidField(name, "leave the field out to keep it; null is no value")
        payload = data.get("payload")
        priority = data.get("priority")
        queue = data.get("queue")
        run_at = data.get("run_at")
        return JobChanges(
            payload_json=None if payload is None else self.payload_json(payload),
            priority=None if priority is None else parse_priority(priority),
            queue=None if queue is None else queue_name(queue),
            available_at=None if run_at is None else parse_time(run_at, "run_at"),
        )

    def edit(self, job_id: int, data: Mapping[str, Any], seen: Seen | None = None) -> Edited:
        """Validate and apply an operator's edit (``Store.edit``): a pending,
        scheduled or failed job keeps its state, a dead one is retried."""
        return self.store.edit(job_id, self.clock(), self.job_changes(data), seen)

    # -- enqueue ------------------------------------------------------------

    def enqueue(
        self,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        priority: int | str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        idempotency_key: str | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        unique: Unique | Mapping[str, Any] | bool | None = None,
    ) -> Enqueued:
        """Enqueue one job (durable when this returns). Returns (job, created)
        as an ``Enqueued``; created is False when ``idempotency_key`` named an
        existing job, or when ``unique`` (or the type's ``unique``) found a job
        holding the key: then ``.duplicate`` is True and the job is the kept one."""
        data: dict[str, Any] = {"type": type, "payload": dict(payload or {})}
        for key, value in (
            ("priority", priority), ("queue", queue), ("max_retries", max_retries),
            ("idempotency_key", idempotency_key), ("run_at", run_at), ("delay_seconds", delay_seconds),
            ("unique", unique),
        ):  # fmt: skip
            if value is not None:
                data[key] = value
        now = self.clock()
        return self.store.enqueue(self.new_job(data, now), now)

    def workflow(self, name: str, *, on_dependency_failure: str = "cancel", key: str | None = None) -> Workflow:
        """Build a workflow: ``.add(name, type, payload, depends_on=[...])``
        per job, then ``.enqueue()`` inserts it whole (``jobdeck.jobs.workflows``)."""
        from jobdeck.jobs.workflows import Workflow

        return Workflow(self, name, on_dependency_failure=on_dependency_failure, key=key)

    def enqueue_workflow(self, data: Mapping[str, Any], *, key: str | None = None) -> EnqueuedWorkflow:
        """Check and enqueue a workflow as the API gives it (``jobdeck.jobs.workflows.parse_workflow``)."""
        from jobdeck.jobs.workflows import parse_workflow

        return self.store.enqueue_workflows([parse_workflow(self, data, key=key)], self.clock())[0]

    def enqueue_named_workflow(self, name: str, *, key: str | None = None) -> EnqueuedWorkflow:
        """Enqueue the workflow declared as ``[workflows.NAME]`` in the config;
        a second call with the same ``key`` returns the first one's jobs."""
        from jobdeck.jobs.workflows import enqueue_configured

        return enqueue_configured(self, name, key)

    def batch(
        self,
        *,
        on_complete: Any = None,
        on_success: Any = None,
        on_dead: Any = None,
        name: str | None = None,
    ) -> Batch:
        """Open a batch; each callback is a job type or ``{type, payload, ...}`` (``jobdeck.jobs.workflows``)."""
        from jobdeck.jobs.workflows import open_batch

        callbacks = {"on_complete": on_complete, "on_success": on_success, "on_dead": on_dead}
        return open_batch(self, name, callbacks)

    def open_batch(self, batch_id: int) -> Batch:
        """A batch opened before (by any process), to add jobs to or close."""
        from jobdeck.jobs.workflows import Batch

        self.store.batch(batch_id)
        return Batch(self, batch_id)

    def enqueue_many(self, items: Sequence[Mapping[str, Any]]) -> list[int]:
        """Enqueue many jobs in one transaction (each item as for the API)."""
        now = self.clock()
        plain = self._plain_jobs(items, now)
        if plain is not None:
            return self.store.enqueue_plain(plain, now)
        return self.store.enqueue_many([self.new_job(item, now) for item in items], now)

    def _plain_jobs(self, items: Sequence[Mapping[str, Any]], now: datetime) -> list[PlainJob] | None:
        """The common bulk shape (``{"type": ..., "payload": {...}}`` and no
        other field) checked in one pass, without a ``NewJob`` per item (that
        cost more than the insert): each type is checked, and its defaults
        found, once by ``new_job`` itself, and each payload by
        ``payload_json``, the check ``new_job`` makes. None when an item has
        any other shape, or when keyed flow limits are configured (the keys
        are computed by ``new_job``): then every item goes through ``new_job``."""
        if self.flow.keyed_columns:
            return None
        defaults: dict[str, tuple[str, int, int]] = {}
        jobs: list[PlainJob] = []
        append = jobs.append
        payload_json = self.payload_json
        for item in items:
            if type(item) is not dict or not _PLAIN.issuperset(item):
                return None
            job_type = item.get("type")
            d = defaults.get(job_type) if type(job_type) is str else None
            if d is None:
                new = self.new_job(item, now)
                if new.unique is not None:
                    return None  # a unique type: each job is checked against the others
                d = defaults[new.type] = (new.queue, new.priority, new.max_retries)
                append((new.type, d[0], new.payload_json or "{}", d[1], d[2]))
            else:
                append((job_type, d[0], payload_json(item.get("payload")), d[1], d[2]))  # type: ignore[arg-type]
        return jobs

    def payload_json(self, payload: Any) -> str:
        """Check a payload and serialize it: an object (or nothing), valid
        JSON (``check_json``), at most ``max_payload_bytes`` encoded."""
        if payload is None or (not payload and type(payload) is dict):
            return "{}"
        if type(payload) is not dict:
            if not isinstance(payload, dict):
                raise InvalidField("payload", "must be a JSON object")
            check_json(payload, "payload")
        else:
            for key, value in payload.items():  # check_json would pass for certain: skip its walk
                kind = type(value)
                if not (type(key) is str and key.isascii()) or not (
                    kind is int or kind is bool or value is None or (kind is str and value.isascii())
                ):
                    check_json(payload, "payload")
                    break
        try:
            text = _ENCODER.encode(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidField("payload", f"not serializable as JSON: {exc}") from None
        limit = self.config.max_payload_bytes
        # A character is at most 4 bytes in UTF-8: count bytes only near the limit.
        if len(text) * 4 > limit and (size := len(text.encode())) > limit:
            raise PayloadTooLarge(size, limit)
        return text

    def new_job(self, data: Mapping[str, Any], now: datetime) -> NewJob:
        """Validate an enqueue request; raise InvalidField naming the field."""
        if not isinstance(data, Mapping):
            raise InvalidField("body", "expected a JSON object")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise InvalidField(unknown[0], "unknown field")
        job_type = data.get("type")
        if not isinstance(job_type, str) or not job_type.strip():
            raise InvalidField("type", "required, a non-empty string")
        job_type = check_name(job_type, "type", MAX_TYPE_CHARS)
        if not self.known_type(job_type):
            raise UnknownType(job_type)
        spec = self.registry.get(job_type)

        payload = data.get("payload", {})
        payload_json = self.payload_json(payload)
        if payload is None:
            payload = {}

        priority = parse_priority(data.get("priority"), default=spec.priority if spec and spec.priority else 0)

        max_retries = data.get("max_retries")
        if max_retries is None:
            max_retries = spec.max_retries if spec and spec.max_retries is not None else self.config.default_max_retries
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidField("max_retries", "must be an integer >= 0")
        if max_retries > MAX_RETRIES:
            raise InvalidField("max_retries", f"must be at most {MAX_RETRIES}")

        key = data.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
            raise InvalidField("idempotency_key", f"must be a non-empty string of at most {MAX_KEY_CHARS} characters")
        if key is not None:
            check_text(key, "idempotency_key", MAX_KEY_CHARS)

        queue = data.get("queue")
        if queue is None:
            queue = spec.queue if spec and spec.queue else "default"
        queue = queue_name(queue)

        available_at = _available_at(data.get("run_at"), data.get("delay_seconds"), now)
        once = self._unique_of(job_type, data, key)
        unique = None
        if once is not None:
            if once.debounce is not None:
                available_at = max(available_at, now + timedelta(seconds=once.debounce))
            unique = claim_for(once, job_type, queue, payload, now)
        rate_key, concurrency_key = self.flow.keys(job_type, queue, payload)
        return NewJob(
            type=job_type,
            payload=payload,
            queue=queue,
            priority=priority,
            max_retries=max_retries,
            idempotency_key=key,
            available_at=available_at,
            payload_json=payload_json,
            unique=unique,
            rate_key=rate_key,
            concurrency_key=concurrency_key,
        )

    def _unique_of(self, job_type: str, data: Mapping[str, Any], key: str | None) -> Unique | None:
        """The enqueue's own ``unique`` (``false``: none), else the type's.
        An explicit ``idempotency_key`` takes the type's place."""
        if "unique" not in data:
            return None if key is not None else self.unique_types.get(job_type)
        value = data["unique"]
        spec = value if isinstance(value, Unique) else parse_unique(value, "unique")
        if spec is not None and key is not None:
            raise InvalidField("unique", "give unique or idempotency_key, not both")
        return spec


_PLAIN = frozenset({"type", "payload"})
_FIELDS = frozenset(
    {"type", "payload", "priority", "max_retries", "idempotency_key", "unique", "run_at", "delay_seconds", "queue"}
)
"""What an enqueue request may carry (``Jobdeck.new_job``)."""

EDITABLE = ("payload", "priority", "queue", "run_at")
"""What an edit may set (``Jobdeck.job_changes``)."""


def queue_name(value: Any) -> str:
    """A queue name as enqueue and edit accept it (``check_name``: normalized, nothing hidden)."""
    return check_name(value, "queue", MAX_QUEUE_CHARS)


def _available_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    if run_at is not None and delay is not None:
        raise InvalidField("run_at", "give run_at or delay_seconds, not both")
    if run_at is not None:
        return parse_time(run_at, "run_at")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
            raise InvalidField("delay_seconds", "must be a finite number >= 0")
        if delay > MAX_DELAY_SECONDS:
            raise InvalidField("delay_seconds", f"must be at most ten years ({MAX_DELAY_SECONDS} seconds)")
        return now + timedelta(seconds=delay)
    return now
