"""Errors the store raises; views turn them into 4xx responses."""

from __future__ import annotations

from typing import Any

from jobdeck.core.states import State, Transition, refusal


class JobdeckError(Exception):
    status_code = 400

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self)}


class JobNotFound(JobdeckError):
    status_code = 404

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class TransitionRefused(JobdeckError):
    """The job is not in a state the transition allows (it moved on)."""

    status_code = 409

    def __init__(self, job_id: int, state: State | str, transition: Transition) -> None:
        super().__init__(refusal(job_id, state, transition))
        self.job_id = job_id
        self.state = State(state)
        self.transition = transition

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "job_id": self.job_id, "status": self.state.value}


class RunNowRefused(TransitionRefused):
    """Run now refused: the job is not scheduled or retrying (it ran or moved
    on meanwhile), or it is due already (``Store.run_now``)."""

    def __init__(self, job_id: int, state: State | str, due: bool = False) -> None:
        if due:
            message = f"job {job_id} is already due; a worker will pick it up"
        else:
            message = f"job {job_id} is {State(state).value}; only scheduled or failed jobs can be run now"
        JobdeckError.__init__(self, message)
        self.job_id = job_id
        self.state = State(state)
        self.transition = Transition.RUN_NOW


class JobMovedOn(TransitionRefused):
    """An edit refused because the job changed since the operator saw it
    (claimed, retried, rescheduled or edited by someone else): nothing was
    changed, and the operator looks again before editing."""

    def __init__(self, job_id: int, state: State | str, attempt: int) -> None:
        JobdeckError.__init__(
            self,
            f"job {job_id} changed since it was shown (it is now {State(state).value}, attempt {attempt}); "
            "nothing was edited: look at it again and redo the edit",
        )
        self.job_id = job_id
        self.state = State(state)
        self.transition = Transition.EDIT


class NotHeld(JobdeckError):
    """The job is running but held by another worker (or another attempt)."""

    status_code = 409

    def __init__(self, job_id: int, worker_id: str, holder: str | None) -> None:
        super().__init__(f"job {job_id} is held by worker {holder!r}, not {worker_id!r}")
        self.job_id = job_id


class StaleAttempt(NotHeld):
    """The worker holds the job, but on a later attempt than the one it
    names: the attempt it reports on is over (it was rescued or released,
    and the same worker claimed the job again)."""

    def __init__(self, job_id: int, attempt: int, current: int) -> None:
        JobdeckError.__init__(self, f"job {job_id} is on attempt {current}; attempt {attempt} is over")
        self.job_id = job_id


class AttemptOver(TransitionRefused):
    """An HTTP worker's effect step for a job that is not running: the
    attempt it names is over (refused as a late complete is, with 409)."""

    def __init__(self, job_id: int, state: State | str) -> None:
        JobdeckError.__init__(
            self, f"job {job_id} is {State(state).value}; only a running job's attempt can start an effect"
        )
        self.job_id = job_id
        self.state = State(state)
        self.transition = Transition.HEARTBEAT
        """The same fence as a heartbeat's: running, held by the worker."""


class IdempotencyConflict(JobdeckError):
    status_code = 409

    def __init__(self, key: str, existing_id: int, why: str) -> None:
        super().__init__(f"idempotency_key {key!r} already belongs to job {existing_id} with {why}")
        self.existing_id = existing_id

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": "idempotency_key", "job_id": self.existing_id}


MAX_FIELD_SHOWN = 80
"""The longest field path a refusal names; a longer one is cut, ending in "…"."""


class InvalidField(JobdeckError):
    status_code = 422

    def __init__(self, field: str, message: str) -> None:
        if len(field) > MAX_FIELD_SHOWN:  # a payload's key is as long as the payload: named, not echoed whole
            field = field[:MAX_FIELD_SHOWN] + "…"
        super().__init__(f"{field}: {message}")
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": self.field}


class UnknownType(InvalidField):
    def __init__(self, type_name: str) -> None:
        super().__init__(
            "type",
            f"unknown job type {type_name!r}: no handler is registered and it is not listed in external_types",
        )


class PayloadTooLarge(JobdeckError):
    status_code = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes; the limit is {limit} bytes")


class ItemRefused(JobdeckError):
    """One job of a bulk enqueue refused, and with it the whole call
    (nothing is inserted): the job's own refusal (its status: 422 for an
    invalid field, 413 for a payload too large, 409 for a conflicting
    idempotency key), its field named under the job's place in the list,
    ``jobs[3].payload``, and ``index`` 3. The CLI names the file's line instead."""

    def __init__(self, index: int, refused: JobdeckError) -> None:
        self.index = index
        self.refused = refused
        self.status_code = refused.status_code
        inner = getattr(refused, "field", None) or ("payload" if isinstance(refused, PayloadTooLarge) else None)
        if isinstance(refused, IdempotencyConflict):
            inner = "idempotency_key"
        self.inner_field = None if inner == "body" else inner
        """The field within the job (None: the job itself is not an object)."""
        self.reason = str(refused).removeprefix(f"{inner}: ") if inner else str(refused)
        self.field = f"jobs[{index}]" + (f".{self.inner_field}" if self.inner_field else "")
        super().__init__(f"{self.field}: {self.reason}")

    def to_dict(self) -> dict[str, Any]:
        return {**self.refused.to_dict(), "error": str(self), "field": self.field, "index": self.index}


# -- the effects ledger (``ctx.effect``) ----------------------------------------


class EffectNotPerformed(Exception):
    """Raised by an effect's function when the effect certainly did not
    happen (the gateway refused the card, the connection was never made).
    The ledger withdraws the key and the attempt fails as usual, so a retry
    performs the effect. Any other exception leaves the outcome unknown."""


class DeadLetter(Exception):
    """Raised from a handler (or its context) when no retry can succeed:
    the worker sends the job straight to ``dead`` for a person, whatever
    retries it has left."""

    retryable = False


class ResultTooLarge(JobdeckError, DeadLetter):
    """A handler's result over ``max_result_bytes`` (as stored: compact
    UTF-8 JSON). The attempt fails and is not retried (the same handler
    would return it again, after redoing its work); an HTTP worker's
    completion carrying one is refused with 413. A result is stored in the
    job's row and sent whole wherever the job is shown: a large output
    belongs in an artifact."""

    status_code = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the result is {size:,} bytes as JSON, over max_result_bytes ({limit:,}): store a large output "
            "as an artifact (ctx.artifact(name, data) in a handler) and return a small reference to it"
        )


class ResultNotJSON(JobdeckError, DeadLetter):
    """A handler returned something JSON cannot hold (a ``datetime``, a
    ``set``, an object, NaN): the attempt fails and is not retried (the
    same handler would return it again). Storing its repr instead, as
    Jobdeck once did, completed the job with a string nobody asked for.
    ``path`` names where, as ``result["when"]``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(
            f"{path}: {problem} (a result is stored as JSON: return dicts, lists, strings, finite numbers, "
            "booleans and None, e.g. a datetime as .isoformat(), a set as sorted(...))"
        )
        self.path = path


class EffectOutcomeUnknown(DeadLetter):
    """An earlier attempt started the effect and never said how it ended:
    performing it again might do it twice, skipping it might never do it."""

    def __init__(self, key: str, job_id: int | None, attempt: int | None, own_job: bool) -> None:
        by = f"attempt {attempt}" if own_job else f"attempt {attempt} of job {job_id}"
        super().__init__(f"effect {key} was started by {by} and its outcome is unknown")
        self.key, self.job_id, self.attempt, self.own_job = key, job_id, attempt, own_job

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt from its own arguments: a process handler's ``ctx.effect``
        receives it from the parent over the pipe, and unpickled from its
        message alone it could not be built at all."""
        return (type(self), (self.key, self.job_id, self.attempt, self.own_job))


class Cancelled(Exception):
    """Raised by ``ctx.check_cancelled()`` in a handler whose job was
    cancelled while it ran: the attempt stops here, and the job ends
    ``cancelled`` (never retried), whatever its retries left."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} was cancelled while it ran")
        self.job_id = job_id


class EffectInProgress(Exception):
    """Another job's attempt is performing the same effect right now and did
    not finish within the wait: this attempt fails and its retry looks again."""


class EffectNotFound(JobdeckError):
    status_code = 404

    def __init__(self, key: str) -> None:
        super().__init__(f"effect {key!r} does not exist")


class UnknownEffect(JobdeckError):
    """An HTTP worker started an effect whose outcome is unknown (an earlier
    attempt started it and never said how it ended): its attempt was failed
    at once, not retryable, as a Python handler's is by
    ``EffectOutcomeUnknown``, and the job is dead (or cancelled, if a cancel
    was requested) for a person to resolve the effect."""

    status_code = 409

    def __init__(self, unknown: EffectOutcomeUnknown, job_id: int, state: State | str, effect: dict[str, Any]) -> None:
        super().__init__(f"{unknown}; job {job_id} is {State(state).value}")
        self.job_id = job_id
        self.state = State(state)
        self.effect = effect

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "job_id": self.job_id, "status": self.state.value, "effect": self.effect}


class EffectStepRefused(JobdeckError):
    """Done or withdraw from an attempt that does not hold the effect (it
    was started by another attempt, or is in a state the step cannot leave)."""

    status_code = 409

    def __init__(self, key: str, state: str, message: str) -> None:
        super().__init__(f"effect {key!r} is {state}{message}")
        self.state = state

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "state": self.state}


class ArtifactNotFound(JobdeckError):
    status_code = 404

    def __init__(self, job_id: int, name: str) -> None:
        super().__init__(f"job {job_id} has no artifact named {name!r}")


class EffectResolveRefused(JobdeckError):
    """Only an unknown (started) effect can be marked by a person."""

    status_code = 409

    def __init__(self, key: str, state: str) -> None:
        super().__init__(f"effect {key!r} is {state}; only started effects (outcome unknown) can be resolved")
        self.state = state

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "state": self.state}
