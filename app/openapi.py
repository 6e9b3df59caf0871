"""The OpenAPI 3.1 document of the JSON API, served at /api/openapi.json.

Kept true by tests/test_openapi.py: every /api route is documented, every
documented path exists, and real responses validate against these schemas.
"""

from __future__ import annotations

from typing import Any

from app.states import PRIORITY_LABELS, State

_TIME = {"type": ["string", "null"], "format": "date-time"}
_STATUS = {"type": "string", "enum": [s.value for s in State]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": _json(_ref("Error"), "Malformed JSON"),
    "401": _json(_ref("Error"), "Missing or invalid bearer token"),
    "422": _json(_ref("Error"), "An invalid field, named in `field`"),
}
_JOB_ERRORS = {
    **_ERRORS,
    "404": _json(_ref("Error"), "Unknown job"),
    "409": _json(_ref("Error"), "The transition is refused (the job is not running, or is held by another worker)"),
}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer"}}
_WORKER = {
    "type": "object",
    "required": ["worker_id"],
    "properties": {"worker_id": {"type": "string", "maxLength": 200}},
}


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def document() -> dict[str, Any]:
    job_action = {
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
                    "properties": {"error": {"type": "string"}, "field": {"type": "string"}},
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
                        "outcome": {"type": "string", "enum": ["completed", "failed", "timed_out", "stalled"]},
                        "error": {"type": ["string", "null"]},
                        "traceback": {"type": ["string", "null"]},
                        "payload": {"type": ["object", "null"]},
                    },
                },
                "Job": {
                    "type": "object",
                    "required": [
                        "id", "type", "queue", "payload", "priority", "priority_label", "status",
                        "retry_count", "max_retries", "available_at", "created_at", "updated_at",
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
                    },
                },
                "NewJob": {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string"},
                        "payload": {"type": "object"},
                        "priority": {
                            "oneOf": [{"type": "integer"}, {"type": "string", "enum": list(PRIORITY_LABELS)}]
                        },
                        "max_retries": {"type": "integer", "minimum": 0},
                        "idempotency_key": {"type": "string", "maxLength": 255},
                        "run_at": {"type": "string", "format": "date-time"},
                        "delay_seconds": {"type": "number", "minimum": 0},
                        "queue": {"type": "string"},
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
                            "Unhealthy: needs a restart (e.g. too many handler threads abandoned after a timeout)",
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
                        "409": _json(_ref("Error"), "The idempotency_key belongs to a job with another type or payload"),
                        "413": _json(_ref("Error"), "Payload too large"),
                        **_ERRORS,
                    },
                },
                "get": {
                    "summary": "List jobs, newest first (keyset pagination)",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": _STATUS},
                        {"name": "type", "in": "query", "schema": {"type": "string"}},
                        {"name": "queue", "in": "query", "schema": {"type": "string"}},
                        {"name": "q", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                        {"name": "cursor", "in": "query", "schema": {"type": "integer"}},
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
                        **_ERRORS,
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
                                "worker_id": {"type": "string"},
                                "types": {"type": "array", "items": {"type": "string"}},
                                "queues": {"type": "array", "items": {"type": "string"}},
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
                    "responses": {"200": _json(_ref("Job"), "The job"), **_JOB_ERRORS},
                }
            },
            "/api/jobs/{job_id}/heartbeat": {"post": {"summary": "Heartbeat a running job", **job_action}},
            "/api/jobs/{job_id}/complete": {
                "post": {
                    "summary": "Complete a running job",
                    **job_action,
                    "requestBody": _body(
                        {"type": "object", "required": ["worker_id"], "properties": {"worker_id": {"type": "string"}, "result": {}}}
                    ),
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
                                "worker_id": {"type": "string"},
                                "error": {"type": "string"},
                                "retryable": {"type": "boolean"},
                                "traceback": {"type": "string"},
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
                        "401": _ERRORS["401"],
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
    from app.openapi_controls import paths as control_paths

    doc["paths"].update(control_paths())
    from app.openapi_effects import paths as effect_paths

    doc["paths"].update(effect_paths())
    return doc
