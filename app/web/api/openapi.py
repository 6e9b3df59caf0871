"""The OpenAPI 3.1 document of the JSON API, served at /api/openapi.json.

Kept true by tests/test_openapi.py: every /api route is documented, every
documented path exists, and real responses validate against these schemas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobdeck.core.states import PRIORITY_LABELS, State
from jobdeck.core.validation import (
    INT64_MAX,
    MAX_JSON_DEPTH,
    MAX_PRIORITY,
    MAX_QUEUE_CHARS,
    MAX_SEARCH_CHARS,
    MAX_TYPE_CHARS,
    PRIORITY_NUMBER,
)
from jobdeck.jobs.intake import MAX_DELAY_SECONDS, MAX_KEY_CHARS, MAX_RETRIES
from jobdeck.jobs.waiting import WAITING_CODES
from jobdeck.store.models import OUTCOMES
from jobdeck.web.api.jobs import MAX_ERROR_CHARS

_TIME = {"type": ["string", "null"], "format": "date-time"}
_STATUS = {"type": "string", "enum": [s.value for s in State]}


def _text(max_length: int, min_length: int = 1, **extra: Any) -> dict[str, Any]:
    """A string bound for a text column: bounded, and never a NUL (PostgreSQL
    refuses one); answered 422 otherwise."""
    return {"type": "string", "minLength": min_length, "maxLength": max_length, "pattern": "^[^\\u0000]*$", **extra}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_UNAUTHORIZED = {
    "401": _json(_ref("Error"), "Missing or invalid bearer token (or, with dashboard users, no signed-in session)")
}
_UNSUPPORTED = {"415": _json(_ref("Error"), "A request body that is not `application/json`")}
_FORBIDDEN = _json(
    _ref("Error"),
    "Refused: a browser's cross-site call without the bearer token, or a dashboard viewer's session",
)
_UNAVAILABLE = _json(
    _ref("Error"),
    "The database cannot take this now (unreachable, locked, read-only, out of memory or of connections: "
    "`cause` says which); retry after `Retry-After` seconds",
)
"""Any operation that reaches the database answers this during an outage, never a 500."""
_FULL = _json(_ref("Error"), "The database's disk is full (`cause` `disk_full`); retry after `Retry-After` seconds")
_ERRORS = {
    "400": _json(_ref("Error"), "Malformed JSON (or not UTF-8)"),
    **_UNAUTHORIZED,
    "408": _json(_ref("Error"), "The body took longer than `http_body_timeout` to arrive; the connection is closed"),
    "413": _json(
        _ref("Error"), "The request body is over the server's cap (three times `max_payload_bytes` plus 64 KiB)"
    ),
    **_UNSUPPORTED,
    "422": _json(
        _ref("Error"),
        f"An invalid field, named in `field`; also a body nested deeper than {MAX_JSON_DEPTH} levels, "
        "holding NaN or Infinity, or a string that is not valid Unicode",
    ),
}
"""What every operation that reads a JSON body can answer besides success."""
_NO_JOB = {"404": _json(_ref("Error"), "Unknown job (also any id beyond 2**63-1)")}
_JOB_ERRORS = {
    **_ERRORS,
    **_NO_JOB,
    "409": _json(_ref("Error"), "The transition is refused (the job is not running, or is held by another worker)"),
}
_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
}
_WORKER_ID = _text(200)
_WORKER = {
    "type": "object",
    "required": ["worker_id"],
    "properties": {"worker_id": _WORKER_ID},
}


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def document(types: Sequence[str] = ()) -> dict[str, Any]:
    """The document; ``types`` are the job types this deployment accepts
    (registered handlers and ``external_types``), published as an enum."""
    job_type: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_TYPE_CHARS}
    if types:
        job_type = {"type": "string", "enum": sorted(types)}
    job_action: dict[str, Any] = {
        "parameters": [_JOB_ID],
        "requestBody": _body(_WORKER),
        "responses": {"200": _json(_ref("Job"), "The job as it now stands"), **_JOB_ERRORS},
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Jobdeck API", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {"type": "string", "description": "What was wrong, in words"},
                        "field": {"type": "string", "description": "The request field at fault"},
                        "job_id": {"type": "integer", "description": "The job concerned (a conflict)"},
                        "status": {"type": "string", "description": "That job's state (a refused transition)"},
                        "cause": {
                            "type": "string",
                            "description": "Why the database cannot take it now (503, 507): unavailable, disk_full, "
                            "read_only, storage_error, out_of_memory, too_many_connections, lock_timeout or statement_timeout",
                        },
                    },
                },
                "Attempt": {
                    "type": "object",
                    "required": ["attempt", "outcome", "started_at", "finished_at"],
                    "properties": {
                        "attempt": {"type": "integer"},
                        "worker_id": {"type": ["string", "null"]},
                        "started_at": _TIME,
                        "finished_at": _TIME,
                        "duration_seconds": {"type": ["number", "null"]},
                        "outcome": {"type": "string", "enum": list(OUTCOMES)},
                        "error": {"type": ["string", "null"]},
                        "traceback": {"type": ["string", "null"]},
                        "payload": {"type": ["object", "null"]},
                        "snooze_seconds": {
                            "type": ["number", "null"],
                            "description": "how long a `snoozed` attempt put its job off",
                        },
                    },
                },
                "Job": {
                    "type": "object",
                    "required": [
                        "id",
                        "type",
                        "queue",
                        "payload",
                        "priority",
                        "priority_label",
                        "status",
                        "retry_count",
                        "max_retries",
                        "available_at",
                        "created_at",
                        "updated_at",
                    ],  # fmt: skip
                    "properties": {
                        "id": {"type": "integer"},
                        "type": {"type": "string"},
                        "queue": {"type": "string"},
                        "payload": {"type": "object"},
                        "priority": {"type": "integer"},
                        "priority_label": {"type": "string", "enum": list(PRIORITY_LABELS)},
                        "status": _STATUS,
                        "scheduled": {"type": "boolean", "description": "pending and not yet due"},
                        "attempt": {"type": "integer"},
                        "retry_count": {"type": "integer"},
                        "max_retries": {"type": "integer"},
                        "idempotency_key": {"type": ["string", "null"]},
                        "available_at": _TIME,
                        "claimed_at": _TIME,
                        "heartbeat_at": _TIME,
                        "worker_id": {"type": ["string", "null"]},
                        "error": {"type": ["string", "null"]},
                        "result": {},
                        "progress": {"type": ["number", "null"]},
                        "progress_message": {"type": ["string", "null"]},
                        "created_at": _TIME,
                        "updated_at": _TIME,
                        "finished_at": _TIME,
                        "attempts": {"type": "array", "items": _ref("Attempt")},
                        "waiting_reason": {
                            "type": ["object", "null"],
                            "description": "why a pending or failed job is not running yet (app/jobs/waiting.py: the code's "
                            "details beside code and a plain-text message); null when nothing holds it back",
                            "required": ["code", "message"],
                            "properties": {"code": {"enum": list(WAITING_CODES)}, "message": {"type": "string"}},
                        },
                    },
                },
                "NewJob": {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {
                        "type": job_type,
                        "payload": {
                            "type": "object",
                            "description": f"At most `max_payload_bytes` as compact UTF-8 JSON (413 past it), "
                            f"at most {MAX_JSON_DEPTH} levels deep, finite numbers only",
                        },
                        "priority": {
                            "description": "An integer, or a label in any case: "
                            + ", ".join(f"{k} {v}" for k, v in PRIORITY_LABELS.items()),
                            "anyOf": [
                                {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
                                {"type": "string", "enum": list(PRIORITY_LABELS)},
                                {"type": "string", "pattern": f"^{PRIORITY_NUMBER.pattern}$"},
                            ],
                        },
                        "max_retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES},
                        "idempotency_key": _text(MAX_KEY_CHARS),
                        "run_at": {
                            "type": "string",
                            "format": "date-time",
                            "description": "Within the years 1 to 9999 in UTC; not with delay_seconds",
                        },
                        "delay_seconds": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": MAX_DELAY_SECONDS,
                            "description": "Not with run_at",
                        },
                        "queue": _text(MAX_QUEUE_CHARS),
                    },
                },
                "TypeHealthWindow": {
                    "type": "object",
                    "required": ["window", "seconds", "types"],
                    "properties": {
                        "window": {"type": "string", "description": "`1 h` or `24 h`"},
                        "seconds": {"type": "integer"},
                        "types": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": [
                                    "type",
                                    "completed",
                                    "failed",
                                    "dead",
                                    "failure_rate",
                                    "p50_seconds",
                                    "p95_seconds",
                                ],  # fmt: skip
                                "properties": {
                                    "type": {"type": "string"},
                                    "completed": {"type": "integer", "description": "attempts that completed"},
                                    "failed": {
                                        "type": "integer",
                                        "description": "attempts failed, timed out or stalled",
                                    },
                                    "dead": {"type": "integer", "description": "jobs that went to dead letter"},
                                    "failure_rate": {
                                        "type": ["number", "null"],
                                        "description": "failed / (completed + failed)",
                                    },
                                    "p50_seconds": {
                                        "type": ["number", "null"],
                                        "description": "From run-time buckets two per doubling: within ±19% "
                                        "(0.0005 means under 1 ms, 8388.6 at least that)",
                                    },
                                    "p95_seconds": {"type": ["number", "null"]},
                                },
                            },
                        },
                    },
                },
                "JobEdit": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": False,
                    "description": "At least one of payload, priority, queue, run_at; a field left out is kept",
                    "properties": {
                        "payload": {
                            "type": "object",
                            "description": "Replaces the payload (same limits as an enqueue); the attempts that "
                            "ran keep the old one",
                        },
                        "priority": {
                            "anyOf": [
                                {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
                                {"type": "string", "enum": list(PRIORITY_LABELS)},
                                {"type": "string", "pattern": f"^{PRIORITY_NUMBER.pattern}$"},
                            ]
                        },
                        "queue": _text(MAX_QUEUE_CHARS),
                        "run_at": {
                            "type": "string",
                            "format": "date-time",
                            "description": "When it becomes due (a dead job: when its retry runs; now if left out)",
                        },
                        "updated_at": {
                            "type": "string",
                            "format": "date-time",
                            "description": "The job's `updated_at` as you read it: the edit is refused (409) "
                            "if the job changed since",
                        },
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/health": {
                "get": {
                    "summary": "Liveness and health of this process",
                    "security": [],
                    "responses": {
                        "200": _json(
                            {"type": "object", "required": ["ok"], "properties": {"ok": {"const": True}}},
                            "Alive and healthy",
                        ),
                        "503": _json(
                            {
                                "type": "object",
                                "required": ["ok", "error", "reasons"],
                                "properties": {
                                    "ok": {"const": False},
                                    "error": {"type": "string"},
                                    "reasons": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                            "Unhealthy: needs a restart (e.g. too many handler threads abandoned after a timeout), "
                            "or database writes fail (a full disk, read-only storage, an outage) until they land again",
                        ),
                    },
                }
            },
            "/api/jobs": {
                "post": {
                    "summary": "Enqueue a job",
                    "requestBody": _body(_ref("NewJob")),
                    "responses": {
                        "201": _json(_ref("Job"), "Created"),
                        "200": _json(_ref("Job"), "The existing job with this idempotency_key"),
                        "409": _json(
                            _ref("Error"), "The idempotency_key belongs to a job with another type or payload"
                        ),
                        **_ERRORS,
                        "413": _json(
                            _ref("Error"), "The payload is over `max_payload_bytes`, or the body over its cap"
                        ),
                    },
                },
                "get": {
                    "summary": "List jobs, newest first (keyset pagination)",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": _STATUS},
                        {"name": "type", "in": "query", "schema": _text(MAX_TYPE_CHARS, 0)},
                        {"name": "queue", "in": "query", "schema": _text(MAX_QUEUE_CHARS, 0)},
                        {"name": "q", "in": "query", "schema": _text(MAX_SEARCH_CHARS, 0)},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                        {
                            "name": "cursor",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["jobs", "next_cursor"],
                                "properties": {
                                    "jobs": {"type": "array", "items": _ref("Job")},
                                    "next_cursor": {"type": ["integer", "null"]},
                                },
                            },
                            "A page of jobs",
                        ),
                        **_UNAUTHORIZED,
                        "422": _ERRORS["422"],
                    },
                },
            },
            "/api/jobs/claim": {
                "post": {
                    "summary": "Claim due jobs (external workers)",
                    "requestBody": _body(
                        {
                            "type": "object",
                            "required": ["worker_id"],
                            "properties": {
                                "worker_id": _WORKER_ID,
                                "types": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _text(200, 0)},
                                "queues": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _text(200, 0)},
                                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                            },
                        }
                    ),
                    "responses": {
                        "200": _json(
                            {"oneOf": [_ref("Job"), {"type": "null"}, {"type": "array", "items": _ref("Job")}]},
                            "One job or null; an array when `limit` is given",
                        ),
                        **_ERRORS,
                    },
                }
            },
            "/api/jobs/{job_id}": {
                "get": {
                    "summary": "A job with its attempts",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json(_ref("Job"), "The job"), **_UNAUTHORIZED, **_NO_JOB},
                },
                "patch": {
                    "summary": "Edit a pending, scheduled or failed job (it keeps its state), or edit and retry a dead one",
                    "parameters": [_JOB_ID],
                    "requestBody": _body(_ref("JobEdit")),
                    "responses": {
                        "200": _json(_ref("Job"), "The job as edited"),
                        **_ERRORS,
                        **_NO_JOB,
                        "403": _FORBIDDEN,
                        "409": _json(
                            _ref("Error"),
                            "The job is not pending, failed or dead, or it changed since `updated_at` "
                            "(claimed, retried, edited meanwhile); nothing was edited",
                        ),
                        "413": _json(
                            _ref("Error"), "The payload is over `max_payload_bytes`, or the body over its cap"
                        ),
                    },
                },
            },
            "/api/jobs/{job_id}/heartbeat": {
                "post": {
                    "summary": "Heartbeat a running job",
                    "parameters": [_JOB_ID],
                    "requestBody": _body(_WORKER),
                    "responses": {
                        **_JOB_ERRORS,
                        "200": _json(
                            {
                                "allOf": [
                                    _ref("Job"),
                                    {
                                        "type": "object",
                                        "required": ["cancel"],
                                        "properties": {
                                            "cancel": {
                                                "type": "boolean",
                                                "description": "True once the job was cancelled: "
                                                "stop work and report complete or fail; the job ends cancelled",
                                            },
                                        },
                                    },
                                ]
                            },
                            "The job; `cancel` says whether to stop",
                        ),
                    },
                }
            },
            "/api/jobs/{job_id}/complete": {
                "post": {
                    "summary": "Complete a running job",
                    **job_action,
                    "requestBody": _body(
                        {
                            "type": "object",
                            "required": ["worker_id"],
                            "properties": {
                                "worker_id": _WORKER_ID,
                                "result": {
                                    "description": f"Any JSON, at most {MAX_JSON_DEPTH} levels deep and "
                                    "`max_result_bytes` (default 1 MiB) as compact UTF-8 JSON"
                                },
                            },
                        }
                    ),
                    "responses": {
                        **job_action["responses"],
                        "413": _json(
                            _ref("Error"),
                            "The request body is over the server's cap, or the result is over `max_result_bytes` "
                            "(the job stays running: keep large outputs elsewhere and complete with a reference)",
                        ),
                    },
                }
            },
            "/api/jobs/{job_id}/fail": {
                "post": {
                    "summary": "Fail a running job (retry with backoff or dead letter)",
                    **job_action,
                    "requestBody": _body(
                        {
                            "type": "object",
                            "required": ["worker_id", "error"],
                            "properties": {
                                "worker_id": _WORKER_ID,
                                "error": _text(MAX_ERROR_CHARS),
                                "retryable": {"type": "boolean"},
                                "traceback": _text(10 * MAX_ERROR_CHARS, 0),
                            },
                        }
                    ),
                }
            },
            "/api/jobs/{job_id}/retry": {
                "post": {
                    "summary": "Retry a failed, dead or discarded job now",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json(_ref("Job"), "The job, pending"), **_JOB_ERRORS},
                }
            },
            "/api/jobs/{job_id}/discard": {
                "post": {
                    "summary": "Discard a pending, failed or dead job",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json(_ref("Job"), "The job, discarded"), **_JOB_ERRORS},
                }
            },
            "/api/jobs/{job_id}/cancel": {
                "post": {
                    "summary": "Cancel a pending, failed or running job (operators; audit-logged)",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": _json(_ref("Job"), "The job, cancelled"),
                        "202": _json(
                            {
                                "allOf": [
                                    _ref("Job"),
                                    {
                                        "type": "object",
                                        "required": ["cancel_requested"],
                                        "properties": {
                                            "cancel_requested": {"const": True},
                                            "cancel_requested_at": _TIME,
                                        },
                                    },
                                ]
                            },
                            "The job is running: its cancel is requested, and it ends cancelled when its attempt "
                            "ends (the handler sees `ctx.cancelled`; an HTTP worker's heartbeat answers `cancel`)",
                        ),
                        **_JOB_ERRORS,
                    },
                }
            },
            "/api/stats": {
                "get": {
                    "summary": "Counts by state",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["counts"],
                                "properties": {
                                    "counts": {
                                        "type": "object",
                                        "additionalProperties": {"type": "integer"},
                                        "required": [s.value for s in State] + ["scheduled"],
                                    }
                                },
                            },
                            "Counts",
                        ),
                        **_UNAUTHORIZED,
                    },
                }
            },
            "/api/stats/types": {
                "get": {
                    "summary": "Each job type's health over the last hour and day (from the per-minute counters)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["windows"],
                                "properties": {"windows": {"type": "array", "items": _ref("TypeHealthWindow")}},
                            },
                            "Per window, per type: attempts completed and failed, jobs dead, run-time percentiles",
                        ),
                        **_UNAUTHORIZED,
                    },
                }
            },
            "/api/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
                }
            },
        },
    }
    from jobdeck.web.api.openapi_queues import FLOW_LIMIT, SCHEDULE
    from jobdeck.web.api.openapi_queues import paths as control_paths
    from jobdeck.web.api.openapi_schedules import paths as schedule_paths
    from jobdeck.web.api.openapi_schedules import schedule_schema

    doc["paths"].update(control_paths(schedule_schema(SCHEDULE)))
    for path, ops in schedule_paths(schedule_schema(SCHEDULE)).items():
        doc["paths"].setdefault(path, {}).update(ops)
    doc["components"]["schemas"]["FlowLimit"] = FLOW_LIMIT
    from jobdeck.web.api.openapi_effects import paths as effect_paths

    doc["paths"].update(effect_paths())
    from jobdeck.web.api.openapi_artifacts import paths as artifact_paths

    doc["paths"].update(artifact_paths())
    from jobdeck.web.api.openapi_errors import paths as error_paths

    doc["paths"].update(error_paths())
    from jobdeck.web.api.openapi_snooze import paths as snooze_paths

    doc["paths"].update(snooze_paths())
    from jobdeck.web.api.openapi_unique import install as install_unique

    install_unique(doc)
    from jobdeck.web.api.openapi_workflows import install as install_workflows

    install_workflows(doc)
    from jobdeck.web.api.openapi_metrics import paths as metrics_paths

    doc["paths"].update(metrics_paths())
    from jobdeck.web.api import openapi_logs

    doc["paths"].update(openapi_logs.paths())
    openapi_logs.amend(doc)
    from jobdeck.web.api import openapi_lists

    openapi_lists.install(doc)
    for path, operations in doc["paths"].items():
        if path == "/api/openapi.json":
            continue
        for method, operation in operations.items():
            operation["responses"].setdefault("503", _UNAVAILABLE)
            operation["responses"].setdefault("507", _FULL)
            if method == "post":
                operation["responses"].setdefault("403", _FORBIDDEN)
            if operation.get("security") != []:
                operation["responses"].setdefault("401", _UNAUTHORIZED["401"])
    return doc
