"""Operator actions, each composed once and recorded the same way whichever
front end asked (the dashboard, the API or the CLI; ``actor`` says who).

- On jobs: ``retry``, ``discard``, ``run_now``, ``cancel``, ``edit`` and
  ``resolve_effect``. Each writes one audit entry (``jobdeck.store.audit``):
  count 1 when it moved the job, count 0 with ``refused: <why>`` when the job
  had moved on (the refusal is then raised for the front end to show). A job
  or effect that does not exist is raised without an entry: nothing was
  refused, there was nothing to act on.
- On many jobs at once (retry, discard, cancel): ``move_ids`` moves a
  batch of ids in one transaction that counts what moved into the bulk
  action's one audit entry (``jobdeck.store.audit``); ``move_matching`` is one
  batch of "every job a filter matches", the dashboard's "all N matching"
  and the CLI's ``--all`` alike, in an entry opened by ``open_matching``.
- On schedules and queues (pause, resume, run now, and creating, editing and
  deleting runtime schedules with what changed): ``record``, which the
  queue controls and the schedulers call. Each is logged at INFO on the
  ``jobdeck.audit`` logger and written to the audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jobdeck.core.errors import EffectNotFound, EffectResolveRefused, TransitionRefused
from jobdeck.core.states import SOURCES, State, Transition
from jobdeck.store.audit import Tally, finish_bulk, open_bulk, record_action
from jobdeck.store.reads import BATCH, next_batch

if TYPE_CHECKING:
    from jobdeck.core.states import EffectState
    from jobdeck.store import JobFilter, JobRecord, Store
    from jobdeck.store.effect_records import EffectRecord
    from jobdeck.store.lifecycle import Edited, JobChanges, Seen

log = logging.getLogger("jobdeck.audit")

T = TypeVar("T")


def retry(store: Store, job_id: int, actor: str, now: datetime) -> JobRecord:
    """A failed, dead or discarded job runs again now, with a fresh retry budget."""
    return audited(store, actor, "retry", job_id, now, lambda: store.retry(job_id, now))


def discard(store: Store, job_id: int, actor: str, now: datetime) -> JobRecord:
    """A pending, failed or dead job is set aside for good."""
    return audited(store, actor, "discard", job_id, now, lambda: store.discard(job_id, now))


def run_now(store: Store, job_id: int, actor: str, now: datetime) -> JobRecord:
    """A scheduled or retrying job becomes due now."""
    return audited(store, actor, "run-now", job_id, now, lambda: store.run_now(job_id, now))


def cancel(store: Store, job_id: int, actor: str, now: datetime) -> JobRecord:
    """Pending, failed and blocked jobs are cancelled at once; a running one comes
    back still running with ``cancel_requested_at`` set, and ends cancelled
    when its attempt ends (the entry says so)."""

    def detail(job: JobRecord) -> str | None:
        return "requested while running; ends when its attempt does" if job.status is State.RUNNING else None

    return audited(store, actor, "cancel", job_id, now, lambda: store.cancel(job_id, now), detail)


def edit(store: Store, job_id: int, changes: JobChanges, actor: str, now: datetime, seen: Seen | None = None) -> Edited:
    """Apply validated changes (``Jobdeck.job_changes``) to a waiting job: a
    pending, scheduled or failed one keeps its state, a dead one is retried.
    ``seen`` is the job as the operator saw it: refused if it changed since."""
    return audited(
        store, actor, "edit", job_id, now, lambda: store.edit(job_id, now, changes, seen), lambda e: e.summary()
    )


def resolve_effect(
    store: Store, job_id: int, key: str, outcome: EffectState, actor: str, now: datetime, result: Any = None
) -> EffectRecord:
    """Mark an unknown (started) effect of this job done or not performed,
    after a person checked the far side; refused for an effect whose outcome
    is known. An effect of another job is one this job does not have."""
    if store.ledger.get(key).job_id != job_id:
        raise EffectNotFound(key)
    verb = f"effect-{outcome.value.replace('_', '-')}"

    def resolve() -> EffectRecord:
        return store.ledger.resolve(key, outcome, actor, now, result=result)

    return audited(store, actor, verb, job_id, now, resolve, lambda _: f"effect {key}")


def audited(
    store: Store,
    actor: str,
    verb: str,
    job_id: int,
    now: datetime,
    act: Callable[[], T],
    detail: Callable[[T], str | None] = lambda _: None,
) -> T:
    """``act``, and its audit entry: count 1 and ``detail`` when it took,
    count 0 and the reason when the job (or effect) had moved on. The one
    rule every action above follows, for a front end that adds its own
    (the CLI's ``JobAction`` entries)."""
    try:
        done = act()
    except (TransitionRefused, EffectResolveRefused) as exc:
        record_action(store, actor, verb, now, count=0, job_id=job_id, detail=f"refused: {exc}")
        raise
    record_action(store, actor, verb, now, count=1, job_id=job_id, detail=detail(done))
    return done


BULK_TRANSITIONS = (Transition.RETRY, Transition.DISCARD, Transition.CANCEL)
"""The actions that have a bulk form (``move_ids``)."""


def move_ids(store: Store, transition: Transition, ids: Sequence[int], now: datetime, tally: Tally) -> list[int]:
    """Retry, discard or cancel the jobs of ``ids`` still in a source state of
    ``transition``, in one transaction that also counts what moved into
    ``tally``'s audit entry (a kill leaves both or neither). Returns the ids
    moved; the rest had moved on and are left alone."""
    moves = {Transition.RETRY: store.retry_ids, Transition.DISCARD: store.discard_ids,
             Transition.CANCEL: store.cancel_ids}  # fmt: skip
    if transition not in moves:
        raise ValueError(f"{transition.value} has no bulk form (one of {', '.join(t.value for t in moves)})")
    return moves[transition](ids, now, tally)


def open_matching(store: Store, transition: Transition, actor: str, now: datetime, *, total: int, detail: str) -> int:
    """Open the audit entry of a bulk action over every job a filter matches
    (``retry all``, ``discard all``), ``total`` of them as counted before it
    starts; ``detail`` says what, in the front end's words. Returns its id
    for ``move_matching``."""
    return open_bulk(store, actor, f"{transition.value} all", now, total=total, detail=detail)


@dataclass(frozen=True)
class Batch:
    """One batch of ``move_matching``."""

    ids: list[int]
    """The ids it read: the next ``BATCH`` matching jobs, newest first."""
    moved: list[int]
    """Those it moved; the others moved on between the read and the move."""
    below: int
    """Where the next batch starts (the lowest id read)."""
    finished: bool
    """Nothing is left to move: the audit entry is closed."""

    @property
    def moved_on(self) -> list[int]:
        """The ids read but not moved (another operator or a worker got there first), newest first."""
        return sorted(set(self.ids) - set(self.moved), reverse=True)


def move_matching(store: Store, transition: Transition, f: JobFilter, entry: int, below: int, now: datetime) -> Batch:
    """One batch of a bulk action over every job ``f`` matches in a source
    state of ``transition`` (the dashboard's "all N matching", the CLI's
    ``--all``): the next ``BATCH`` of them with ids under ``below``, newest
    first, moved by ``move_ids`` into the action's entry (``open_matching``).
    A short batch, or an empty one, finishes the entry; a front end calls
    again with the returned ``below`` until ``finished``, one short
    transaction each."""
    batch = next_batch(store, f, now, SOURCES[transition], below)
    finished = len(batch) < BATCH
    moved = move_ids(store, transition, batch, now, Tally(entry, last=finished)) if batch else []
    if not batch:
        finish_bulk(store, entry, now)
    return Batch(batch, moved, min(batch) if batch else below, finished)


@dataclass(frozen=True)
class Action:
    actor: str
    """Who: a dashboard user name, ``api`` or ``cli``."""
    verb: str
    """What: ``schedule.pause``, ``schedule.resume``, ``schedule.run``,
    ``queue.pause``, ``queue.resume``, ``schedule.create``, ``schedule.update``,
    ``schedule.delete``."""
    target: str
    """The schedule's or queue's name."""
    at: datetime
    detail: dict[str, Any] = field(default_factory=dict)


def record(
    actor: str,
    verb: str,
    target: str,
    at: datetime,
    *,
    store: Store | None = None,
    changes: str | None = None,
    **detail: Any,
) -> Action:
    """Log the action and write it to the audit log (when given the store);
    ``changes`` is the before/after diff of an edit, kept after the target."""
    if changes is not None:
        detail["changes"] = changes
    action = Action(actor, verb, target, at, detail)
    if store is None:
        log.info("%s by %s: %s %s", verb, actor, target, detail or "",
                 extra={"event": "audit", "actor": actor, "action": verb, "target": target})  # fmt: skip
    else:  # record_action logs it (jobdeck.audit)
        job_id = detail.get("job_id")
        text = target if changes is None else f"{target}: {changes}"
        record_action(store, actor, verb, at, count=1 if job_id else 0, job_id=job_id, detail=text)
    return action
