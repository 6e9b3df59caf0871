"""Errors the store raises; views turn them into 4xx responses."""

from __future__ import annotations

from typing import Any

from app.states import State, Transition, refusal


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


class NotHeld(JobdeckError):
    """The job is running but held by another worker (or another attempt)."""

    status_code = 409

    def __init__(self, job_id: int, worker_id: str, holder: str | None) -> None:
        super().__init__(f"job {job_id} is held by worker {holder!r}, not {worker_id!r}")
        self.job_id = job_id


class IdempotencyConflict(JobdeckError):
    status_code = 409

    def __init__(self, key: str, existing_id: int, why: str) -> None:
        super().__init__(f"idempotency_key {key!r} already belongs to job {existing_id} with {why}")
        self.existing_id = existing_id

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": "idempotency_key", "job_id": self.existing_id}


class InvalidField(JobdeckError):
    status_code = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": self.field}


class UnknownType(InvalidField):
    def __init__(self, type_name: str) -> None:
        super().__init__(
            "type",
            f"unknown job type {type_name!r}: no handler is registered and it is not "
            "listed in external_types",
        )


class PayloadTooLarge(JobdeckError):
    status_code = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes; the limit is {limit} bytes")
