"""The pieces every part of the OpenAPI document shares: the error answers,
the job id parameter, the bounded text schema.

The parts (``openapi_jobs``, ``openapi_queues``, ...) import these from here and
``openapi`` assembles them, so no part imports the assembler back."""

from __future__ import annotations

from typing import Any

from jobdeck.core.states import State
from jobdeck.core.validation import INT64_MAX, MAX_JSON_DEPTH

TIME = {"type": ["string", "null"], "format": "date-time"}


def text(max_length: int, min_length: int = 1, **extra: Any) -> dict[str, Any]:
    """A string bound for a text column: bounded, and never a NUL (PostgreSQL
    refuses one); answered 422 otherwise."""
    return {"type": "string", "minLength": min_length, "maxLength": max_length, "pattern": "^[^\\u0000]*$", **extra}


def ref(name: str) -> dict[str, str]:
    """A schema of ``components``: a schema used in more than one place is
    one component, so a generated client has one model for it, not one per
    operation that answers it (tests/test_openapi.py finds a repeated one)."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(name: str) -> dict[str, Any]:
    """The component ``name``, or null."""
    return {"anyOf": [ref(name), {"type": "null"}]}


JOB_STATE = {"type": "string", "enum": [s.value for s in State], "description": "A job's state"}
STATUS = ref("JobState")


def answer(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


UNAUTHORIZED = {
    "401": answer(ref("Error"), "Missing or invalid bearer token (or, with dashboard users, no signed-in session)")
}
UNSUPPORTED = {"415": answer(ref("Error"), "A request body that is not `application/json`")}
FORBIDDEN = answer(
    ref("Error"),
    "Refused: the token lacks the operation's scope (named in `scope`), a claim named a type or queue "
    "outside the token's, a browser's cross-site call without a bearer token, or a dashboard viewer's session",
)
UNAVAILABLE = answer(
    ref("Error"),
    "The database cannot take this now (unreachable, locked, read-only, out of memory or of connections: "
    "`cause` says which); retry after `Retry-After` seconds",
)
"""Any operation that reaches the database answers this during an outage, never a 500."""
FULL = answer(ref("Error"), "The database's disk is full (`cause` `disk_full`); retry after `Retry-After` seconds")
ERRORS = {
    "400": answer(ref("Error"), "Malformed JSON (or not UTF-8)"),
    **UNAUTHORIZED,
    "408": answer(ref("Error"), "The body took longer than `http_body_timeout` to arrive; the connection is closed"),
    "413": answer(
        ref("Error"), "The request body is over the server's cap (three times `max_payload_bytes` plus 64 KiB)"
    ),
    **UNSUPPORTED,
    "422": answer(
        ref("Error"),
        f"An invalid field, named in `field`; also a body nested deeper than {MAX_JSON_DEPTH} levels, "
        "holding NaN or Infinity, or a string that is not valid Unicode",
    ),
}
"""What every operation that reads a JSON body can answer besides success."""
NO_JOB = {"404": answer(ref("Error"), "Unknown job (also any id beyond 2**63-1)")}
JOB_ERRORS = {
    **ERRORS,
    **NO_JOB,
    "409": answer(ref("Error"), "The transition is refused (the job is not running, or is held by another worker)"),
}
JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
}
WORKER_ID = text(200)
WORKER = {
    "type": "object",
    "required": ["worker_id"],
    "properties": {"worker_id": WORKER_ID},
}


def request_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def new_jobs(item: str, description: str) -> dict[str, Any]:
    """A body that carries one or more jobs as ``jobs``, each an ``item``
    schema: the bulk enqueue's ``NewJobs`` and a batch's ``NewBatchJobs``."""
    return {
        "type": "object",
        "required": ["jobs"],
        "additionalProperties": False,
        "properties": {"jobs": {"type": "array", "minItems": 1, "items": ref(item), "description": description}},
    }
