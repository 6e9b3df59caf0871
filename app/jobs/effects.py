"""The effects ledger's rules, once, for every kind of worker: what an
attempt that reaches an effect's key must do (``begin``).

``JobContext.effect`` (a Python handler) and the HTTP worker's
``POST /api/jobs/<id>/effects/<key>/start`` both ask ``begin`` and act on
its answer; the ledger's statements (``jobdeck.store.ledger``) are the only
SQL either runs, so an HTTP worker and a Python handler meeting on one key
follow the same rules on the same row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.errors import EffectNotFound, EffectOutcomeUnknown, EffectStepRefused, InvalidField, UnknownEffect
from jobdeck.core.states import EffectState
from jobdeck.core.validation import check_result_size
from jobdeck.store.effect_records import EffectRecord, storable

if TYPE_CHECKING:
    from jobdeck.store import Store
    from jobdeck.store.ledger import Ledger


class Decision(str, enum.Enum):
    """What the attempt does next, as the HTTP API names it."""

    PERFORM = "perform"
    """The key is now ``started`` by this attempt: perform the side effect,
    then record it done (with its result) or withdraw it (not performed)."""

    SKIP = "skip"
    """The effect is ``done`` (by an earlier attempt, or another job): do not
    perform it; its stored result is what it returned."""

    WAIT = "wait"
    """Another job's attempt that is still running holds the key: the effect
    is in flight, not lost. Ask again in a moment."""

    UNKNOWN = "unknown"
    """An attempt that is over (or this very one, earlier) started it and never
    said how it ended: performing it again might do it twice, skipping it
    might never do it. The job goes to ``dead`` for a person."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Begun:
    decision: Decision
    record: EffectRecord
    """The key's row as this attempt left it (or found it)."""
    replayed: EffectRecord | None = None
    """With PERFORM of a replay-safe effect: the row as the attempt whose
    outcome is unknown left it (this attempt took the key over from it)."""

    def unknown_error(self, job_id: int) -> EffectOutcomeUnknown:
        """The error that sends the job to ``dead`` (UNKNOWN only)."""
        seen = self.record
        return EffectOutcomeUnknown(seen.key, seen.job_id, seen.attempt, seen.job_id == job_id)


MAX_KEY = 255
"""The ledger's key column: a longer key cannot name an effect."""


def checked_key(key: Any) -> str:
    """``key`` if the ledger can hold it: a string of at most ``MAX_KEY``
    characters without NUL. Checked before anything is recorded or performed:
    PostgreSQL refused a longer key only at the insert, and SQLite stored it."""
    if not isinstance(key, str) or "\x00" in key or len(key) > MAX_KEY:
        raise InvalidField("key", f"an effect key is a string of at most {MAX_KEY} characters, without NUL")
    return key


def begin(
    ledger: Ledger, key: str, job_id: int, attempt: int, worker_id: str, now: datetime, *, replay_safe: bool = False
) -> Begun:
    """Record ``key`` started by this attempt, or say why not (``Decision``).

    A ``not_performed`` key is started again. A ``started`` key whose holder
    is another job's running attempt is WAIT; any other ``started`` key
    (its attempt is over, or it is this attempt's own from an earlier call:
    the call may have performed it) is UNKNOWN, unless ``replay_safe``: the
    downstream deduplicates by the key itself, so this attempt takes the key
    over and performs it again. Each step is one conditional statement of
    the ledger; a take-over refused because the row moved looks again."""
    while True:
        start = ledger.start(key, job_id, attempt, worker_id, now)
        seen = start.record
        if start.mine:
            return Begun(Decision.PERFORM, seen)
        if seen.state is EffectState.DONE:
            return Begun(Decision.SKIP, seen)
        own_attempt = seen.job_id == job_id and seen.attempt == attempt
        if start.holder_running and not own_attempt:
            return Begun(Decision.WAIT, seen)
        if not replay_safe:
            return Begun(Decision.UNKNOWN, seen)
        taken = ledger.take_over(seen, job_id, attempt, worker_id, now)
        if taken is not None:
            return Begun(Decision.PERFORM, taken, replayed=seen)


# -- an HTTP worker's steps (``jobdeck.web.api.effects``) -----------------------------


def start(
    store: Store, key: str, job_id: int, attempt: int, worker_id: str, now: datetime, *, replay_safe: bool = False
) -> Begun:
    """``begin`` for an HTTP worker, fenced by its attempt (``Ledger.held``:
    a stale attempt or another worker's claim is refused with 409, as a late
    complete is). UNKNOWN is not answered: the attempt is failed in the same
    transaction, not retryable, as a Python handler's attempt is when
    ``ctx.effect`` raises ``EffectOutcomeUnknown``, and ``UnknownEffect``
    (409) says the job is dead."""
    from jobdeck.store.records import Outcome  # the store's side, loaded with it (a child runs ``begin`` only)

    with store.ledger.held(job_id, attempt, worker_id):
        begun = begin(store.ledger, key, job_id, attempt, worker_id, now, replay_safe=replay_safe)
        if begun.decision is not Decision.UNKNOWN:
            return begun
        unknown = begun.unknown_error(job_id)
        error = f"{type(unknown).__name__}: {unknown}"
        (ended,) = store.fail_many([Outcome(job_id, worker_id, attempt=attempt, error=error, retryable=False)], now)
    raise UnknownEffect(unknown, job_id, ended.status, begun.record.to_dict())


def finish(
    store: Store, key: str, job_id: int, attempt: int, worker_id: str, result: Any, max_bytes: int, now: datetime
) -> EffectRecord:
    """An HTTP worker's ``done``: the effect happened, with ``result`` (any
    JSON, at most ``max_bytes`` as stored, else ``ResultTooLarge``, 413).
    Accepted from the attempt and worker that started the key, even once
    the job moved on: a late done is the truth about the effect, as with
    ``ctx.effect``. Sent again (its answer was lost), answers the row."""
    text = storable(result)
    check_result_size(text, max_bytes)
    if store.ledger.finish(key, job_id, attempt, text, now, worker_id=worker_id):
        return store.ledger.get(key)
    return _already(store, key, job_id, attempt, worker_id, EffectState.DONE, "marked done")


def withdraw(store: Store, key: str, job_id: int, attempt: int, worker_id: str, now: datetime) -> EffectRecord:
    """An HTTP worker's "not performed": the side effect certainly did not
    happen, so the next attempt that reaches the key performs it. Only from
    ``started``, by the attempt and worker that started it."""
    if store.ledger.withdraw(key, job_id, attempt, now, worker_id=worker_id):
        return store.ledger.get(key)
    return _already(store, key, job_id, attempt, worker_id, EffectState.NOT_PERFORMED, "withdrawn")


def _already(
    store: Store, key: str, job_id: int, attempt: int, worker_id: str, target: EffectState, verb: str
) -> EffectRecord:
    """After a refused done or withdraw: the row, if this attempt's step
    already left it in ``target`` (the same request again); else why not."""
    record = store.ledger.get(key)  # EffectNotFound (404) when no attempt started it
    if record.job_id != job_id:
        raise EffectNotFound(key)  # another job's effect is one this job does not have
    mine = (record.attempt, record.worker_id) == (attempt, worker_id)
    if mine and record.state is target:
        return record
    if not mine:
        holder = f"attempt {record.attempt} (worker {record.worker_id!r})"
        raise EffectStepRefused(key, record.state.value, f", started by {holder}: only that attempt can have it {verb}")
    raise EffectStepRefused(key, record.state.value, f"; a {record.state.value} effect cannot be {verb}")
