"""Why is it waiting? The one reason a claimable job (pending, or failed
with its retry ahead) is not running yet, as a structured value the
dashboard and the API render alike::

    {"code": "queue_paused", "message": "Queue reports is paused", "queue": "reports"}

A blocked workflow job has one reason, ``dependencies`` (``left``: how
many are not completed yet). For the others, the reasons are checked in
this order, and the first that holds is given:

1. ``queue_paused``: its queue is paused (the claim skips the queue).
2. ``concurrency_limit``: its queue's limit, then its type's, is reached
   (``scope`` "queue" or "type", ``name``, ``running``, ``limit``).
   ``flow_limit``: a rate limit, a concurrency per key or a limit a handler
   closed holds it (``jobdeck.jobs.flow``; ``limit_kind`` rate, concurrency_key or
   closed, ``scope``, ``name``, ``limit``, ``rate``, ``key``, ``until``).
3. ``scheduled`` (pending) or ``retry_backoff`` (failed): not due until ``at``.
4. ``no_worker``: nothing live serves its type. A registered type is served
   by any worker pool (every pool serves every queue) that heart-beats within
   the stall timeout and is healthy; an external type by an HTTP worker,
   known to be live when it holds a job of the type with a fresh heartbeat or
   finished one within the stall timeout (``external`` says which).
5. ``workers_busy``: every live pool's slots are taken (``workers``, ``slots``).

Otherwise the reason is None: the job is claimed as soon as the jobs ahead
of it are. The conditions that block a job whatever the time come first
(an operator's pause, then a limit), so a scheduled job in a paused queue
says "paused": when its time comes it will still not run. A limit comes
before workers because with the limit reached no free worker takes it.

The decision (``waiting_reason``) is pure; ``WaitingReasons`` makes the
few reads it needs (``jobdeck.store.waiting``) once, at the first job that asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.states import SOURCES, State, Transition
from jobdeck.store import JobRecord
from jobdeck.store.records import Holders
from jobdeck.store.waiting import WaitingReads, read_waiting

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck

WAITING_STATES = SOURCES[Transition.CLAIM]
"""Only a job the claim could take can be waiting for something."""

WAITING_CODES = (
    "dependencies", "queue_paused", "concurrency_limit", "flow_limit", "scheduled", "retry_backoff", "no_worker", "workers_busy",
)  # fmt: skip
"""Every reason's ``code``, in the order they are checked (the API's enum)."""

Reason = dict[str, Any]


@dataclass(frozen=True)
class Pool:
    """A live worker pool: heart-beating within the stall timeout."""

    id: str
    threads: int
    running: int
    healthy: bool


@dataclass(frozen=True)
class Situation:
    """Everything the decision looks at, read once per request."""

    now: datetime
    stall_timeout: float
    paused: frozenset[str]
    queue_limits: Mapping[str, int]
    type_limits: Mapping[str, int]
    running_by_queue: Mapping[str, int]
    running_by_type: Mapping[str, int]
    pools: tuple[Pool, ...]
    local_types: frozenset[str]
    """Types with a handler registered: served by the worker pools."""
    http_types: frozenset[str]
    """External types an HTTP worker is known to be serving now."""
    flow_held: Callable[[JobRecord], dict[str, Any] | None] | None = None
    """The flow limit holding a job back (``jobdeck.jobs.flow_claim.waiting_check``), when any are configured."""


def waiting_reason(job: JobRecord, s: Situation) -> Reason | None:
    """The first reason (module doc, in order) that keeps ``job`` from being claimed."""
    if job.status is State.BLOCKED:
        return _blocked(job)
    if job.status not in WAITING_STATES:
        return None
    for check in _CHECKS:
        reason = check(job, s)
        if reason is not None:
            return reason
    return None


def _blocked(job: JobRecord) -> Reason:
    """A workflow job waits for its dependencies before anything else (``jobdeck.jobs.workflows``)."""
    left = job.deps_left or 0
    noun = "dependency" if left == 1 else "dependencies"
    return _reason("dependencies", f"Waiting for {left} {noun} to complete", left=left)


def _reason(code: str, message: str, **details: Any) -> Reason:
    assert code in WAITING_CODES, code
    return {"code": code, "message": message, **details}


def _paused(job: JobRecord, s: Situation) -> Reason | None:
    if job.queue not in s.paused:
        return None
    return _reason("queue_paused", f"Queue {job.queue} is paused", queue=job.queue)


def _limit(scope: str, name: str, limits: Mapping[str, int], running: Mapping[str, int]) -> Reason | None:
    limit = limits.get(name)
    if limit is None or running.get(name, 0) < limit:
        return None
    n = running.get(name, 0)
    return _reason(
        "concurrency_limit",
        f"{scope.capitalize()} {name} is at its concurrency limit ({n} of {limit} running)",
        scope=scope, name=name, running=n, limit=limit,
    )  # fmt: skip


def _queue_limit(job: JobRecord, s: Situation) -> Reason | None:
    return _limit("queue", job.queue, s.queue_limits, s.running_by_queue)


def _type_limit(job: JobRecord, s: Situation) -> Reason | None:
    return _limit("type", job.type, s.type_limits, s.running_by_type)


def _flow_limit(job: JobRecord, s: Situation) -> Reason | None:
    held = s.flow_held(job) if s.flow_held is not None else None
    if held is None or held["kind"] == "concurrency":
        return None  # the global limits have their own reason, checked before
    from jobdeck.jobs.flow import shown_key
    from jobdeck.jobs.flow_claim import reason_message

    until = held.get("until")
    return _reason(
        "flow_limit", reason_message(held)[:1].upper() + reason_message(held)[1:], limit_kind=held["kind"],
        scope=held["scope"], name=held["name"], limit=held["limit"], rate=held.get("rate"),
        key=None if held["key"] is None else shown_key(held["key"]),
        until=None if until is None else until.isoformat().replace("+00:00", "Z"),
    )  # fmt: skip


def _not_due(job: JobRecord, s: Situation) -> Reason | None:
    if job.available_at <= s.now:
        return None
    at = job.available_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    iso = job.available_at.isoformat().replace("+00:00", "Z")
    if job.status is State.FAILED:
        return _reason("retry_backoff", f"Retrying at {at}", at=iso)
    return _reason("scheduled", f"Scheduled for {at}", at=iso)


def _no_worker(job: JobRecord, s: Situation) -> Reason | None:
    if job.type in s.local_types:
        if any(p.healthy for p in s.pools):
            return None
        if s.pools:
            message = "No healthy worker: every live worker pool reports itself unhealthy"
        else:
            message = f"No live worker: no worker pool has heart-beaten in the last {s.stall_timeout:g} s"
        return _reason("no_worker", message, type=job.type, external=False)
    if job.type in s.http_types:
        return None
    return _reason(
        "no_worker",
        f"No live worker: no HTTP worker has worked a {job.type} job in the last {s.stall_timeout:g} s",
        type=job.type, external=True,
    )  # fmt: skip


def _all_busy(job: JobRecord, s: Situation) -> Reason | None:
    if job.type not in s.local_types:
        return None  # an HTTP worker's capacity is its own; it claims when it has room
    healthy = [p for p in s.pools if p.healthy]
    slots = sum(p.threads for p in healthy)
    if any(p.running < p.threads for p in healthy):
        return None
    n = len(healthy)
    return _reason(
        "workers_busy",
        f"All workers are busy ({slots} of {slots} slots taken on {n} worker{'s' if n != 1 else ''})",
        workers=n, slots=slots,
    )  # fmt: skip


_CHECKS: tuple[Callable[[JobRecord, Situation], Reason | None], ...] = (
    _paused,
    _queue_limit,
    _type_limit,
    _flow_limit,
    _not_due,
    _no_worker,
    _all_busy,
)


def situation(
    reads: WaitingReads,
    *,
    now: datetime,
    stall_timeout: float,
    paused: frozenset[str],
    queue_limits: Mapping[str, int],
    type_limits: Mapping[str, int],
    local_types: frozenset[str],
    external_types: frozenset[str],
) -> Situation:
    """Fold the store's reads into what the decision looks at: running counts
    per queue and type, the live pools with their busy slots, and the external
    types an HTTP worker (a holder with no pool row) is serving."""
    cutoff = now - timedelta(seconds=stall_timeout)
    by_queue: dict[str, int] = {}
    by_type: dict[str, int] = {}
    by_worker: dict[str | None, int] = {}
    for g in reads.running:
        by_queue[g.queue] = by_queue.get(g.queue, 0) + g.count
        by_type[g.type] = by_type.get(g.type, 0) + g.count
        by_worker[g.worker_id] = by_worker.get(g.worker_id, 0) + g.count
    pool_ids = {p.id for p in reads.pools}
    pools = tuple(
        Pool(p.id, p.threads, by_worker.get(p.id, 0), p.unhealthy is None)
        for p in reads.pools
        if p.heartbeat_at >= cutoff
    )
    held_by_http = {
        g.type
        for g in reads.running
        if g.worker_id not in pool_ids and g.heartbeat_at is not None and g.heartbeat_at >= cutoff
    }
    http_types = external_types & (held_by_http | reads.recently_finished_types)
    return Situation(
        now, stall_timeout, paused, queue_limits, type_limits, by_queue, by_type, pools, local_types, http_types
    )


class WaitingReasons:
    """The reasons for the jobs of one request: the reads are made once, at
    the first job that can be waiting, so a page of completed jobs (or an
    API answer about a running one) reads nothing."""

    def __init__(self, load: Callable[[], Situation]) -> None:
        self._load = load
        self._situation: Situation | None = None

    def of(self, job: JobRecord) -> Reason | None:
        if job.status is State.BLOCKED:
            return _blocked(job)  # its own row says it all: nothing to read
        if job.status not in WAITING_STATES:
            return None
        if self._situation is None:
            self._situation = self._load()
        return waiting_reason(job, self._situation)


def for_deck(deck: Jobdeck, now: datetime) -> WaitingReasons:
    """Reasons on ``deck`` as of ``now``: the paused queues from the queue
    controls' cached set (what the claim itself skips), the limits from
    config, the rest from ``jobdeck.store.waiting``."""
    return WaitingReasons(situation_loader(deck, now))


def situation_loader(deck: Jobdeck, now: datetime, holders: Holders | None = None) -> Callable[[], Situation]:
    """The reads of ``for_deck``, not made yet; with ``holders`` (read
    already, by an enqueue right after its commit) only the reads it lacks."""

    def load() -> Situation:
        local = frozenset(deck.registry.names())
        external = frozenset(deck.config.external_types) - local
        stall = float(deck.config.stall_timeout)
        reads = read_waiting(deck.store, now - timedelta(seconds=stall), external, holders)
        found = situation(
            reads, now=now, stall_timeout=stall, paused=deck.queues.paused(),
            queue_limits=deck.queues.limits.queues, type_limits=deck.queues.limits.types,
            local_types=local, external_types=external,
        )  # fmt: skip
        if not deck.queues.flow:
            return found
        from dataclasses import replace

        from jobdeck.jobs.flow_claim import waiting_check

        return replace(found, flow_held=waiting_check(deck.queues.flow_claim, deck.store, now))

    return load
