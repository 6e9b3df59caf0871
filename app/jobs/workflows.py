"""Workflows and batches: jobs that wait for other jobs, and jobs grouped
for one callback. This module builds and checks them; ``jobdeck.store.graph``
stores them and moves their jobs.

A workflow is a graph enqueued in one transaction::

    deck.workflow("nightly-sales")
        .add("extract-eu", "reports.extract", {"region": "eu"})
        .add("extract-us", "reports.extract", {"region": "us"})
        .add("build", "reports.build", {}, depends_on=["extract-eu", "extract-us"])
        .enqueue()

A job with dependencies is ``blocked`` until they have all completed; the
completion of the last one makes it ``pending`` in its own transaction. When
a dependency ends dead, cancelled or discarded, its dependents are cancelled
("dependency extract-eu is dead"), unless ``on_dependency_failure="hold"``
(per workflow or per job): then they wait, blocked, until a person retries
the dependency (a cancelled one cannot be retried: it cancels them anyway). A dependent reads its dependencies' results with
``ctx.dependency_results()``.

A batch groups jobs that run independently::

    with deck.batch(on_complete="reports.mail", on_dead="reports.page") as batch:
        for region in regions:
            batch.add("reports.extract", {"region": region})

Once it is closed (the ``with`` ends, or ``batch.close()``) and every job has
ended (completed, dead, cancelled or discarded), its callbacks are enqueued
once, each with ``payload["batch"]``: the batch's id, name, counts by state
and job ids. ``on_complete`` always fires, ``on_success`` when every job
completed, ``on_dead`` when any is dead. Until it is closed, jobs can be
added, by any process (``deck.open_batch(id).add(...)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from jobdeck import actions
from jobdeck.core.clock import Clock
from jobdeck.core.config import Config, ConfigError
from jobdeck.core.errors import InvalidField, JobdeckError
from jobdeck.core.states import Transition
from jobdeck.core.validation import check_text, hidden_problem
from jobdeck.store import NewJob, Store
from jobdeck.store.audit import Tally, open_bulk
from jobdeck.store.graph import CALLBACKS, ON_DEPENDENCY_FAILURE, EnqueuedWorkflow, NewWorkflow, Step

if TYPE_CHECKING:
    from jobdeck.store.graph import BatchRecord

MAX_NAME_CHARS = 200
DEFAULT_MAX_JOBS = 1000
"""``[workflows] max_jobs``: the most jobs one workflow may have."""
_STEP_FIELDS = frozenset({"name", "depends_on", "on_dependency_failure"})
_WORKFLOW_FIELDS = frozenset({"name", "jobs", "on_dependency_failure", "key"})
REFUSED_OPTIONS = ("idempotency_key", "unique")
"""Job options a workflow step may not carry: a workflow is made once by its own ``key``."""


class Enqueuer(Protocol):
    """What workflows and batches use of a deck (``jobdeck.deck.Jobdeck`` is
    one): its config (``[workflows]``), its store and clock, and its check
    of each job (``new_job``, as for a single enqueue)."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...

    def new_job(self, data: Mapping[str, Any], now: datetime) -> NewJob: ...


RESERVED_KEY_PREFIX = "schedule:"
"""Workflow keys of schedule fires (``jobdeck.maintenance.cron.fire_key``): no
caller may take one, or it would answer in the schedule's stead."""


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidField(field, "required, a non-empty string")
    check_text(value, field, MAX_NAME_CHARS)
    # Shown in pages, the graph's labels and logs, where these break lines or reverse text.
    problem = hidden_problem(value)
    if problem is not None:
        raise InvalidField(field, problem)
    return value


def _policy(value: Any, field: str, default: str) -> str:
    if value is None:
        return default
    if value not in ON_DEPENDENCY_FAILURE:
        raise InvalidField(field, f"must be one of {', '.join(ON_DEPENDENCY_FAILURE)}, not {value!r}")
    return str(value)


def parse_workflow(deck: Enqueuer, data: Any, *, key: str | None = None) -> NewWorkflow:
    """Check a workflow as the API and the config give it
    (``{name, jobs: [{name, type, payload, depends_on, ...}], on_dependency_failure, key}``):
    every field is checked, every job as ``POST /api/jobs`` checks it, and
    the graph must be acyclic with every dependency named in it. Raises
    ``InvalidField`` (422) naming what is wrong; nothing is inserted."""
    if not isinstance(data, Mapping):
        raise InvalidField("body", "expected a JSON object")
    unknown = sorted(set(data) - _WORKFLOW_FIELDS)
    if unknown:
        raise InvalidField(unknown[0], "unknown field")
    name = _name(data.get("name"), "name")
    policy = _policy(data.get("on_dependency_failure"), "on_dependency_failure", "cancel")
    given_key = data.get("key", key)
    if given_key is not None:
        if not isinstance(given_key, str) or not given_key or len(given_key) > 255:
            raise InvalidField("key", "must be a non-empty string of at most 255 characters")
        check_text(given_key, "key", 255)
        if "key" in data and given_key.startswith(RESERVED_KEY_PREFIX):
            raise InvalidField("key", f"keys starting {RESERVED_KEY_PREFIX!r} are the schedules' own")
    items = data.get("jobs")
    if not isinstance(items, list) or not items:
        raise InvalidField("jobs", "required, a non-empty list of jobs")
    limit = max_jobs(deck)
    if len(items) > limit:
        raise InvalidField("jobs", f"a workflow may have at most {limit} jobs ([workflows] max_jobs), not {len(items)}")
    now = deck.clock()
    steps: list[Step] = []
    for i, item in enumerate(items):
        where = f"jobs[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidField(where, "expected a JSON object")
        step_name = _name(item.get("name"), f"{where}.name")
        depends = item.get("depends_on", [])
        if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
            raise InvalidField(f"{where}.depends_on", "must be a list of job names")
        for j, dep in enumerate(depends):
            _name(dep, f"{where}.depends_on[{j}]")
        if len(set(depends)) != len(depends):
            raise InvalidField(f"{where}.depends_on", "names a job twice")
        for refused in REFUSED_OPTIONS:
            if refused in item:
                raise InvalidField(f"{where}.{refused}", "not allowed in a workflow; give the workflow a key instead")
        job_data = {k: v for k, v in item.items() if k not in _STEP_FIELDS}
        try:
            job = deck.new_job(job_data, now)
        except InvalidField as exc:
            raise InvalidField(f"{where}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
        step_policy = _policy(item.get("on_dependency_failure"), f"{where}.on_dependency_failure", policy)
        steps.append(Step(step_name, job, tuple(depends), step_policy))
    return NewWorkflow(name, tuple(in_order(steps)), policy, given_key)


def in_order(steps: Sequence[Step]) -> list[Step]:
    """The steps with each after its dependencies (Kahn's algorithm, stable);
    refuses duplicate names, unknown dependencies and cycles."""
    by_name: dict[str, Step] = {}
    for i, s in enumerate(steps):
        if s.name in by_name:
            raise InvalidField(f"jobs[{i}].name", f"{s.name!r} names two jobs of the workflow")
        by_name[s.name] = s
    for i, s in enumerate(steps):
        for dep in s.depends_on:
            if dep not in by_name:
                raise InvalidField(f"jobs[{i}].depends_on", f"{dep!r} is not a job of the workflow")
            if dep == s.name:
                raise InvalidField(f"jobs[{i}].depends_on", f"{s.name!r} depends on itself")
    waiting = {s.name: len(s.depends_on) for s in steps}
    dependents: dict[str, list[str]] = {s.name: [] for s in steps}
    for s in steps:
        for dep in s.depends_on:
            dependents[dep].append(s.name)
    ready = [s.name for s in steps if not s.depends_on]
    ordered: list[Step] = []
    while ready:
        name = ready.pop(0)
        ordered.append(by_name[name])
        for nxt in dependents[name]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(ordered) < len(steps):
        raise InvalidField("jobs", f"the dependencies form a cycle: {' -> '.join(_cycle(by_name, waiting))}")
    return ordered


def _cycle(by_name: Mapping[str, Step], waiting: Mapping[str, int]) -> list[str]:
    """One cycle among the steps Kahn's algorithm could not order, for the message."""
    left = {n for n, w in waiting.items() if w > 0}
    node = min(left)
    seen: list[str] = []
    while node not in seen:
        seen.append(node)
        node = next(d for d in by_name[node].depends_on if d in left)
    return [*seen[seen.index(node) :], node]


def max_jobs(deck: Enqueuer) -> int:
    value = deck.config.extra.get("workflows", {}).get("max_jobs", DEFAULT_MAX_JOBS)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_MAX_JOBS


class Workflow:
    """A workflow being built (``Jobdeck.workflow``); ``enqueue`` checks and
    inserts it whole, in one transaction."""

    def __init__(self, deck: Enqueuer, name: str, *, on_dependency_failure: str = "cancel", key: str | None = None):
        self.deck = deck
        self.data: dict[str, Any] = {"name": name, "jobs": [], "on_dependency_failure": on_dependency_failure}
        if key is not None:
            self.data["key"] = key

    def add(
        self,
        name: str,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        depends_on: Iterable[str] = (),
        on_dependency_failure: str | None = None,
        **options: Any,
    ) -> Workflow:
        """Add a job named ``name`` (unique in the workflow); ``options`` are
        the enqueue's (``queue``, ``priority``, ``max_retries``, ``run_at``, ...)."""
        job: dict[str, Any] = {"name": name, "type": type, "payload": {} if payload is None else payload, **options}
        if isinstance(depends_on, str):  # list("ab") would be two dependencies, "a" and "b"
            raise InvalidField(
                f"jobs[{len(self.data['jobs'])}].depends_on", "must be a list of job names, not a string"
            )
        job["depends_on"] = list(depends_on)
        if on_dependency_failure is not None:
            job["on_dependency_failure"] = on_dependency_failure
        self.data["jobs"].append(job)
        return self

    def enqueue(self) -> EnqueuedWorkflow:
        new = parse_workflow(self.deck, self.data)
        return self.deck.store.enqueue_workflows([new], self.deck.clock())[0]


CALLBACK_FIELDS = frozenset({"type", "payload", "queue", "priority", "max_retries"})


def parse_callback(deck: Enqueuer, value: Any, field: str, name: str | None = None) -> dict[str, Any] | None:
    """A batch callback: a job type, or ``{type, payload, queue, priority,
    max_retries}``. It is enqueued once by the batch, so a type's ``unique``
    does not apply to it, and its payload may not hold ``batch`` (the
    batch's own figures go there). The payload is checked with a ``batch``
    like the one it will carry (``name`` is the batch's), so a typed
    callback that could not take one is refused now, not dead when it fires."""
    if value is None:
        return None
    data: Mapping[str, Any] = {"type": value} if isinstance(value, str) else value
    if not isinstance(data, Mapping):
        raise InvalidField(field, "must be a job type or an object with a type")
    unknown = sorted(set(data) - CALLBACK_FIELDS)
    if unknown:
        raise InvalidField(
            f"{field}.{unknown[0]}", f"unknown field; a callback takes {', '.join(sorted(CALLBACK_FIELDS))}"
        )
    payload = data.get("payload")
    if isinstance(payload, Mapping) and "batch" in payload:
        raise InvalidField(f"{field}.payload.batch", "reserved: the callback's payload gets the batch's figures there")
    if payload is None or isinstance(payload, Mapping):  # checked as it will be enqueued: a typed one sees ``batch``
        data = {**data, "payload": {**(payload or {}), "batch": _sample_batch(name, field)}}
    try:
        job = deck.new_job({**data, "unique": False}, deck.clock())
    except InvalidField as exc:
        raise InvalidField(f"{field}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
    own = {key: value for key, value in job.payload.items() if key != "batch"}
    spec = {"type": job.type, "payload": own, "queue": job.queue, "priority": job.priority}
    return {**spec, "max_retries": job.max_retries}


def _sample_batch(name: str | None, callback: str) -> dict[str, Any]:
    """What a callback's ``payload["batch"]`` holds when it fires (``jobdeck.store.graph_store``)."""
    return {"id": 1, "name": name, "counts": {"completed": 1}, "job_ids": [1], "callback": callback}


class Batch:
    """An open batch (``Jobdeck.batch``, ``Jobdeck.open_batch``). ``add``
    enqueues into it at once; ``close`` (or leaving ``with``) says no more
    will come, after which the end of its last job fires its callbacks."""

    def __init__(self, deck: Enqueuer, batch_id: int) -> None:
        self.deck = deck
        self.id = batch_id

    def add(self, type: str, payload: Mapping[str, Any] | None = None, **options: Any) -> int:
        return self.add_many([{"type": type, "payload": {} if payload is None else payload, **options}])[0]

    def add_many(self, items: Sequence[Mapping[str, Any]]) -> list[int]:
        now = self.deck.clock()
        news = []
        for i, item in enumerate(items):
            for refused in REFUSED_OPTIONS:
                if refused in item:
                    raise InvalidField(f"jobs[{i}].{refused}", "not allowed in a batch")
            news.append(self.deck.new_job(item, now))
        return self.deck.store.add_to_batch(self.id, news, now)

    def close(self) -> BatchRecord:
        return self.deck.store.close_batch(self.id, self.deck.clock())

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        """Closed however the block ends: the jobs added are enqueued already
        and run, so a batch left open would never fire for them."""
        self.close()


def open_batch(deck: Enqueuer, name: str | None, callbacks: Mapping[str, Any]) -> Batch:
    if name is not None:
        _name(name, "name")
    unknown = sorted(set(callbacks) - set(CALLBACKS))
    if unknown:
        raise InvalidField(unknown[0], "unknown callback")
    checked = {k: parse_callback(deck, v, k, name) for k, v in callbacks.items() if v is not None}
    return Batch(deck, deck.store.open_batch(name, checked, deck.clock()))


# -- workflows declared in config ------------------------------------------------------

_CONFIG_FIELDS = frozenset({"jobs", "on_dependency_failure"})


class UnknownWorkflow(JobdeckError):
    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"no workflow named {name!r} in the config ([workflows.NAME])")


def parse_config_workflows(deck: Enqueuer) -> dict[str, dict[str, Any]]:
    """The ``[workflows.NAME]`` tables, each checked as ``POST /api/workflows``
    checks a body (``parse_workflow``) so that a bad one stops start-up with a
    ConfigError naming it, not the first schedule that fires it at 2 a.m.
    Returns name -> the workflow's data, parsed again at each enqueue (its
    jobs' times count from then)::

        [workflows.nightly-sales]
        on_dependency_failure = "cancel"
        [[workflows.nightly-sales.jobs]]
        name = "extract-eu"
        type = "reports.extract"
        payload = {region = "eu"}
    """
    table = deck.config.extra.get("workflows", {})
    if not isinstance(table, Mapping):
        raise ConfigError("workflows: expected a table ([workflows])")
    limit = table.get("max_jobs", DEFAULT_MAX_JOBS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"workflows.max_jobs: expected a whole number >= 1, got {limit!r}")
    found: dict[str, dict[str, Any]] = {}
    for name, entry in table.items():
        if name == "max_jobs":
            continue
        where = f"workflows.{str(name)[:MAX_NAME_CHARS]}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a table ([workflows.NAME] with [[workflows.NAME.jobs]])")
        unknown = sorted(set(entry) - _CONFIG_FIELDS, key=str)
        if unknown:
            raise ConfigError(f"{where}: unknown key {str(unknown[0])[:80]!r} (only jobs, on_dependency_failure)")
        data = {"name": name, **entry}
        try:
            parse_workflow(deck, data)
        except JobdeckError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        found[name] = data
    return found


def enqueue_configured(
    deck: Enqueuer, workflows: Mapping[str, dict[str, Any]], name: str, key: str | None = None
) -> EnqueuedWorkflow:
    """Enqueue the config's workflow ``name`` (of ``workflows``, from
    ``parse_config_workflows``) once per ``key`` (``Jobdeck.enqueue_named_workflow``)."""
    data = workflows.get(name)
    if data is None:
        raise UnknownWorkflow(name)
    return deck.store.enqueue_workflows([parse_workflow(deck, data, key=key)], deck.clock())[0]


def act_on_workflow(deck: Enqueuer, workflow_id: int, transition: Transition, actor: str, verb: str) -> list[int]:
    """Retry the failed part of a workflow (``Transition.RETRY``) or cancel
    the rest (``Transition.CANCEL``), as one bulk action: its audit entry is
    opened with the jobs it applies to, and counts what moved in the move's
    own transaction (``jobdeck.store.audit``). Returns the ids moved; raises
    ``WorkflowNotFound``."""
    now = deck.clock()
    members = deck.store.workflow_members(workflow_id, transition)
    entry = open_bulk(deck.store, actor, verb, now, total=len(members), detail=f"workflow {workflow_id}")
    return actions.move_ids(deck.store, transition, members, now, Tally(entry, last=True))
