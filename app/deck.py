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

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck import actions
from jobdeck.core.clock import Clock, DatabaseClock, HostClock, default_clock
from jobdeck.core.config import Config, artifact_max_bytes, load, log_limits
from jobdeck.core.errors import InvalidField, ItemRefused, JobdeckError
from jobdeck.health import Health
from jobdeck.jobs.flow import Flow, parse_flow
from jobdeck.jobs.handlers import Registry, import_modules
from jobdeck.jobs.handlers import registry as default_registry
from jobdeck.jobs.handles import use_deck
from jobdeck.jobs.intake import Intake
from jobdeck.jobs.queues import QueueControls, parse_limits
from jobdeck.jobs.unique import Unique, parse_unique_types
from jobdeck.jobs.workflows import (
    Batch,
    Workflow,
    enqueue_configured,
    open_batch,
    parse_config_workflows,
    parse_workflow,
)
from jobdeck.maintenance.alerts import Alerts, parse_alerts
from jobdeck.maintenance.cron import Periodic, Targets, parse_schedules
from jobdeck.maintenance.runtime_schedules import RuntimeSchedules
from jobdeck.maintenance.schedule_health import ScheduleHealth
from jobdeck.maintenance.thresholds import ThresholdAlerts, parse_thresholds
from jobdeck.maintenance.upkeep import Maintenance, parse_retention
from jobdeck.store import JobRecord, NewJob, Store
from jobdeck.store.lifecycle import Edited, JobChanges, Seen
from jobdeck.store.opening import open_store
from jobdeck.store.records import Answered, Enqueued
from jobdeck.store.timekeeping import database_time
from jobdeck.tracing import AttemptTracer, tracer_for

if TYPE_CHECKING:
    from flask import Flask
    from jobdeck.runtime import Runtime
    from jobdeck.store.graph import EnqueuedWorkflow


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
        self.store = store if store is not None else open_store(config)
        try:
            self._build(config, clock)
        except BaseException:
            if owned:  # a config refused at start-up leaves no connection open behind it
                self.store.engine.dispose()
            raise

    def _build(self, config: Config, clock: Clock | None) -> None:
        if clock is None:
            clock = default_clock(
                sqlite=self.store.sqlite, stall_timeout=config.stall_timeout, warn_after=config.clock_skew_warn
            )
        self.clock: Clock = clock
        """What every time this deck writes or compares comes from (``jobdeck.core.clock``)."""
        self.store.fresh_time = clock if isinstance(clock, DatabaseClock | HostClock) else None
        on_database_clock = isinstance(clock, DatabaseClock) and not self.store.sqlite
        self.store.void_after = config.stall_timeout / 2 if on_database_clock else None
        self.store.backoff = self.backoff
        self.store.artifact_max_bytes = artifact_max_bytes(config)
        self.unique_types: dict[str, Unique] = parse_unique_types(config)
        """``[types."T"] unique`` (``jobdeck.jobs.unique``), checked at start-up."""
        self.log_limits = log_limits(config)
        """``[logs]``: the caps and flush interval of per-job logs (``jobdeck.jobs.joblogs``)."""
        self.tracing: AttemptTracer | None = tracer_for(config)
        """OpenTelemetry when ``[tracing] enabled``, else None (``jobdeck.tracing``)."""

        if config.demo:
            from jobdeck.demo import add_demo_config

            add_demo_config(config)
        self.flow: Flow = Flow(parse_flow(config))
        """Rate limits and concurrency per key (``jobdeck.jobs.flow``): the enqueue computes the keys."""
        if self.flow.keyed_columns:
            self.store.flow_keys = self.flow.keys
        self.intake = Intake(config, self.registry, self.flow, self.unique_types)
        """The validated way in for new jobs and edits (``jobdeck.jobs.intake``)."""
        self.health: Health = Health()
        self.health.register(lambda: self.store.storage.problem(self.clock()))
        self.alerts: Alerts = Alerts(
            self.store, self.clock, self.registry, parse_alerts(config),
            superseded=lambda payload: self.schedule_health.superseded(payload),
        )  # fmt: skip
        self.alerts.install()  # registers jobdeck.alert before the schedules are checked against the types
        self.thresholds: ThresholdAlerts = ThresholdAlerts(
            self.store, self.clock, self.registry, parse_thresholds(config), self.alerts.settings, config.stall_timeout
        )
        self.thresholds.install()
        self.configured_workflows: dict[str, dict[str, Any]] = parse_config_workflows(self)
        """``[workflows.NAME]``, checked at start-up; the schedules that fire them are checked against it."""
        workflows = self.configured_workflows
        targets = Targets(
            self.known_type, self.new_job, workflows, lambda name, key: parse_workflow(self, workflows[name], key=key)
        )
        if self.tracing is not None:
            targets = dataclasses.replace(targets, fire_span=self.tracing.fire)
        self.schedules: Periodic = Periodic(
            self.store, parse_schedules(config.extra.get("schedules"), targets), targets, config.poll_interval,
            health=lambda: self.schedule_health.view(),
        )  # fmt: skip
        self.runtime_schedules: RuntimeSchedules = RuntimeSchedules(self.store, self.schedules)
        self.schedule_health: ScheduleHealth = ScheduleHealth(self.store, self.schedules.all, self.alerts.settings)
        self.queues: QueueControls = QueueControls(
            self.store, parse_limits(config), refresh=config.poll_interval, flow=self.flow
        )
        self.queues.install()
        self.maintenance: Maintenance = Maintenance(
            self.store, self.clock, config.stall_timeout, parse_retention(config)
        )
        self.intake.warn_unknown_types()
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
        return cls.of(load(path, env, overrides), registry, init_db=init_db)

    @classmethod
    def of(cls, config: Config, registry: Registry | None = None, *, init_db: bool = True) -> Jobdeck:
        """The deck of a loaded config: its ``handler_modules`` imported, the
        demo's types registered with ``demo``, and with ``init_db`` the schema
        brought up to date. What ``create_app`` and ``jobdeck worker`` build on.
        It becomes this process's deck, the one a handler's ``.enqueue`` goes
        through (``jobdeck.jobs.handles``)."""
        registry = registry if registry is not None else default_registry
        import_modules(config.handler_modules)
        if config.demo:
            from jobdeck import demo

            demo.register(registry)
        deck = cls(config, registry)
        if init_db:
            deck.init_db()
        use_deck(deck)  # the one handles enqueue through: ``charge.enqueue(...)``
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
        from jobdeck import create_app
        from jobdeck.embed import mount

        build = lambda: create_app(deck=self)  # noqa: E731
        secret = self.config.secret_key
        return mount(build, secret, host, url_prefix, current_role, current_name=current_name, login_url=login_url)

    def start(self, *, workers: int | None = None, scheduler: bool = True) -> Runtime:
        """Start this process's worker pool (``workers`` threads, default the
        config's) and scheduler through the one runtime object; a second call
        does nothing. In a process forked after the deck was built (gunicorn's
        ``post_fork`` with ``--preload``) the inherited database connections
        are dropped first, never shared with the parent. The started deck is
        the one handles enqueue through (``jobdeck.jobs.handles``)."""
        from jobdeck.runtime import Runtime

        if self._runtime is None:
            if os.getpid() != self._built_in:
                self.store.engine.dispose(close=False)
                self._built_in = os.getpid()
            self._runtime = Runtime(self, workers=workers, services=scheduler)
        self._runtime.start()
        use_deck(self)
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

    # -- policy -------------------------------------------------------------

    def backoff(self, job_type: str, retry_count: int) -> float:
        """The retry delay of a job of this type (``Intake.backoff``)."""
        return self.intake.backoff(job_type, retry_count)

    def type_names(self) -> list[str]:
        """Every job type this deployment accepts (``Intake.type_names``)."""
        return self.intake.type_names()

    def known_type(self, name: str) -> bool:
        return self.intake.known_type(name)

    def new_job(self, data: Mapping[str, Any], now: datetime) -> NewJob:
        """Validate an enqueue request (``Intake.new_job``), in the trace
        context current, with tracing on (``jobdeck.tracing``)."""
        new = self.intake.new_job(data, now)
        if self.tracing is not None:
            new.traceparent = self.tracing.current_traceparent()
        return new

    def payload_json(self, payload: Any) -> str:
        """Check and serialize a payload (``Intake.payload_json``)."""
        return self.intake.payload_json(payload)

    # -- operator actions -----------------------------------------------------

    def cancel(self, job_id: int, actor: str) -> JobRecord:
        """Cancel a job, the one way the API, the dashboard and the CLI do it,
        audit-logged as done by ``actor``. Pending and failed jobs are
        ``cancelled`` at once; a running one comes back still ``running``
        with ``cancel_requested_at`` set, and ends ``cancelled`` when its
        attempt ends (``State.CANCELLED``). A refusal (``TransitionRefused``,
        ``JobNotFound``) is raised after the refused attempt is logged."""
        return actions.cancel(self.store, job_id, actor, self.clock())

    # -- edit ---------------------------------------------------------------

    def job_changes(self, data: Mapping[str, Any], job_type: str | None = None) -> JobChanges:
        """Validate an edit like an enqueue (``Intake.job_changes``); a new
        payload also by the shape of ``job_type``'s handler, if typed."""
        return self.intake.job_changes(data, job_type)

    def edit(self, job_id: int, data: Mapping[str, Any], seen: Seen | None = None) -> Edited:
        """Validate and apply an operator's edit (``Store.edit``): a pending,
        scheduled or failed job keeps its state, a dead one is retried."""
        job_type = self.store.get(job_id).type if data.get("payload") is not None else None
        return self.store.edit(job_id, self.clock(), self.job_changes(data, job_type), seen)

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
        return Workflow(self, name, on_dependency_failure=on_dependency_failure, key=key)

    def enqueue_workflow(self, data: Mapping[str, Any], *, key: str | None = None) -> EnqueuedWorkflow:
        """Check and enqueue a workflow as the API gives it (``jobdeck.jobs.workflows.parse_workflow``)."""
        return self.store.enqueue_workflows([parse_workflow(self, data, key=key)], self.clock())[0]

    def enqueue_named_workflow(self, name: str, *, key: str | None = None) -> EnqueuedWorkflow:
        """Enqueue the workflow declared as ``[workflows.NAME]`` in the config;
        a second call with the same ``key`` returns the first one's jobs."""
        return enqueue_configured(self, self.configured_workflows, name, key)

    def batch(
        self,
        *,
        on_complete: Any = None,
        on_success: Any = None,
        on_dead: Any = None,
        name: str | None = None,
    ) -> Batch:
        """Open a batch; each callback is a job type or ``{type, payload, ...}`` (``jobdeck.jobs.workflows``)."""
        callbacks = {"on_complete": on_complete, "on_success": on_success, "on_dead": on_dead}
        return open_batch(self, name, callbacks)

    def open_batch(self, batch_id: int) -> Batch:
        """A batch opened before (by any process), to add jobs to or close."""
        self.store.batch(batch_id)
        return Batch(self, batch_id)

    def enqueue_each(self, items: Sequence[Any]) -> list[Enqueued]:
        """Enqueue at most ``max_bulk_jobs`` jobs in one transaction, each
        checked as ``enqueue`` checks one and answered as one is (created,
        duplicate), in order: ``POST /api/jobs/bulk`` and ``jobdeck enqueue
        --file``. One refused job refuses them all (``ItemRefused`` naming its
        index); nothing is inserted."""
        self._bulk_size(items)
        now = self.clock()
        news = []
        for i, item in enumerate(items):
            try:
                news.append(self.new_job(item, now))
            except JobdeckError as exc:
                raise ItemRefused(i, exc) from None
        return self.store.enqueue_each(news, now)

    def enqueue_bulk(self, items: Sequence[Any]) -> list[Answered]:
        """``enqueue_each`` answered by id (``POST /api/jobs/bulk``, ``jobdeck
        enqueue --file``): the same checks, one transaction and answer per
        job, without a ``JobRecord`` made for each. A call whose jobs all
        take the common shape (``Intake.plain_shape``: a type and a payload,
        nothing else) is checked in one pass and inserted as ``enqueue_many``
        inserts it (``Intake.plain_jobs``, whose refusal names the job as
        ``enqueue_each``'s does); any other call goes through ``enqueue_each``.
        Either way each job is checked once."""
        self._bulk_size(items)
        if not self.intake.plain_shape(items):
            return [Answered(e.job.id, e.created, e.duplicate, e.changed) for e in self.enqueue_each(items)]
        now = self.clock()
        plain = self.intake.plain_jobs(items, now)
        trace = self.tracing.current_traceparent() if self.tracing is not None else None
        return [Answered(job_id, True, False, False) for job_id in self.store.enqueue_plain(plain, now, trace)]

    def _bulk_size(self, items: Sequence[Any]) -> None:
        limit = self.config.max_bulk_jobs
        if not 1 <= len(items) <= limit:
            raise InvalidField("jobs", f"1 to {limit} jobs in one call (max_bulk_jobs), not {len(items)}")

    def enqueue_many(self, items: Sequence[Mapping[str, Any]]) -> list[int]:
        """Enqueue many jobs in one transaction (each item as for the API)."""
        now = self.clock()
        if not self.intake.plain_shape(items):
            return self.store.enqueue_many([self.new_job(item, now) for item in items], now)
        try:
            plain = self.intake.plain_jobs(items, now)
        except ItemRefused as exc:
            raise exc.refused from None  # this call's refusals never named the job
        trace = self.tracing.current_traceparent() if self.tracing is not None else None
        return self.store.enqueue_plain(plain, now, trace)
