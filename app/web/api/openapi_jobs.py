"""OpenAPI paths of the jobs API (``jobdeck.web.api.jobs``): enqueue, the
external-worker protocol (``jobdeck.web.api.worker_protocol``), reads,
operator actions, stats and health, and the schemas they answer and take."""

from __future__ import annotations

from typing import Any

from jobdeck.core.states import State
from jobdeck.core.validation import INT64_MAX, MAX_JSON_DEPTH, MAX_QUEUE_CHARS, MAX_SEARCH_CHARS, MAX_TYPE_CHARS
from jobdeck.web.api.openapi_common import (
    ERRORS,
    FORBIDDEN,
    JOB_ERRORS,
    JOB_ID,
    NO_JOB,
    STATUS,
    TIME,
    UNAUTHORIZED,
    WORKER_ID,
    answer,
    ref,
    request_body,
    text,
)
from jobdeck.web.api.worker_protocol import MAX_ERROR_CHARS

SCHEMAS: dict[str, Any] = {
    "Health": {
        "type": "object",
        "required": ["ok"],
        "properties": {
            "ok": {"type": "boolean", "description": "true with 200 (healthy), false with 503"},
            "error": {"type": "string", "description": "with 503: the reasons in one line"},
            "reasons": {"type": "array", "items": {"type": "string"}, "description": "with 503"},
        },
    },
    "JobPage": {
        "type": "object",
        "required": ["jobs", "next_cursor"],
        "properties": {
            "jobs": {"type": "array", "items": ref("Job")},
            "next_cursor": {"type": ["integer", "null"]},
        },
    },
    "ClaimRequest": {
        "type": "object",
        "required": ["worker_id"],
        "properties": {
            "worker_id": WORKER_ID,
            "types": {"type": "array", "minItems": 1, "maxItems": 1000, "items": text(200, 0)},
            "queues": {"type": "array", "minItems": 1, "maxItems": 1000, "items": text(200, 0)},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
    },
    "HeartbeatRequest": {"type": "object", "required": ["worker_id"], "properties": {"worker_id": WORKER_ID}},
    "HeartbeatAnswer": {
        "allOf": [
            ref("Job"),
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
    "CompleteRequest": {
        "type": "object",
        "required": ["worker_id"],
        "properties": {
            "worker_id": WORKER_ID,
            "result": {
                "description": f"Any JSON, at most {MAX_JSON_DEPTH} levels deep and "
                "`max_result_bytes` (default 1 MiB) as compact UTF-8 JSON"
            },
        },
    },
    "FailRequest": {
        "type": "object",
        "required": ["worker_id", "error"],
        "properties": {
            "worker_id": WORKER_ID,
            "error": text(MAX_ERROR_CHARS),
            "retryable": {"type": "boolean"},
            "traceback": text(10 * MAX_ERROR_CHARS, 0),
        },
    },
    "CancelRequested": {
        "allOf": [
            ref("Job"),
            {
                "type": "object",
                "required": ["cancel_requested"],
                "properties": {
                    "cancel_requested": {
                        "type": "boolean",
                        "description": "Always true in this answer: the cancel is requested, not yet done",
                    },
                    "cancel_requested_at": TIME,
                },
            },
        ]
    },
    "Stats": {
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
    "TypeHealth": {
        "type": "object",
        "required": ["windows"],
        "properties": {"windows": {"type": "array", "items": ref("TypeHealthWindow")}},
    },
}
"""The schemas of these paths, components of the document."""


def paths() -> dict[str, Any]:
    job_answer = {"200": answer(ref("Job"), "The job as it now stands"), **JOB_ERRORS}
    return {
        "/api/health": {
            "get": {
                "operationId": "getHealth",
                "tags": ["process"],
                "summary": "Liveness and health of this process",
                "security": [],
                "responses": {
                    "200": answer(ref("Health"), "Alive and healthy (`ok` true)"),
                    "503": answer(
                        ref("Health"),
                        "Unhealthy (`ok` false): needs a restart (e.g. too many handler threads abandoned after a "
                        "timeout), or database writes fail (a full disk, read-only storage, an outage) until they "
                        "land again",
                    ),
                },
            }
        },
        "/api/jobs": {
            "post": {
                "operationId": "enqueueJob",
                "tags": ["jobs"],
                "summary": "Enqueue a job",
                "requestBody": request_body(ref("NewJob")),
                "responses": {
                    "201": answer(ref("Job"), "Created"),
                    "200": answer(ref("Job"), "The existing job with this idempotency_key"),
                    "409": answer(ref("Error"), "The idempotency_key belongs to a job with another type or payload"),
                    **ERRORS,
                    "413": answer(ref("Error"), "The payload is over `max_payload_bytes`, or the body over its cap"),
                },
            },
            "get": {
                "operationId": "listJobs",
                "tags": ["jobs"],
                "summary": "List jobs, newest first (keyset pagination)",
                "parameters": [
                    {"name": "status", "in": "query", "schema": STATUS},
                    {"name": "type", "in": "query", "schema": text(MAX_TYPE_CHARS, 0)},
                    {"name": "queue", "in": "query", "schema": text(MAX_QUEUE_CHARS, 0)},
                    {"name": "q", "in": "query", "schema": text(MAX_SEARCH_CHARS, 0)},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
                    },
                ],
                "responses": {
                    "200": answer(ref("JobPage"), "A page of jobs"),
                    **UNAUTHORIZED,
                    "422": ERRORS["422"],
                },
            },
        },
        "/api/jobs/claim": {
            "post": {
                "operationId": "claimJobs",
                "tags": ["worker"],
                "summary": "Claim due jobs (external workers)",
                "requestBody": request_body(ref("ClaimRequest")),
                "responses": {
                    "200": answer(
                        {"oneOf": [ref("Job"), {"type": "null"}, {"type": "array", "items": ref("Job")}]},
                        "One job or null; an array when `limit` is given",
                    ),
                    **ERRORS,
                },
            }
        },
        "/api/jobs/{job_id}": {
            "get": {
                "operationId": "getJob",
                "tags": ["jobs"],
                "summary": "A job with its attempts",
                "parameters": [JOB_ID],
                "responses": {"200": answer(ref("Job"), "The job"), **UNAUTHORIZED, **NO_JOB},
            },
            "patch": {
                "operationId": "editJob",
                "tags": ["jobs"],
                "summary": "Edit a pending, scheduled or failed job (it keeps its state), or edit and retry a dead one",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("JobEdit")),
                "responses": {
                    "200": answer(ref("Job"), "The job as edited"),
                    **ERRORS,
                    **NO_JOB,
                    "403": FORBIDDEN,
                    "409": answer(
                        ref("Error"),
                        "The job is not pending, failed or dead, or it changed since `updated_at` "
                        "(claimed, retried, edited meanwhile); nothing was edited",
                    ),
                    "413": answer(ref("Error"), "The payload is over `max_payload_bytes`, or the body over its cap"),
                },
            },
        },
        "/api/jobs/{job_id}/heartbeat": {
            "post": {
                "operationId": "heartbeat",
                "tags": ["worker"],
                "summary": "Heartbeat a running job",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("HeartbeatRequest")),
                "responses": {
                    **JOB_ERRORS,
                    "200": answer(ref("HeartbeatAnswer"), "The job; `cancel` says whether to stop"),
                },
            }
        },
        "/api/jobs/{job_id}/complete": {
            "post": {
                "operationId": "completeJob",
                "tags": ["worker"],
                "summary": "Complete a running job",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("CompleteRequest")),
                "responses": {
                    **job_answer,
                    "413": answer(
                        ref("Error"),
                        "The request body is over the server's cap, or the result is over `max_result_bytes` "
                        "(the job stays running: keep large outputs elsewhere and complete with a reference)",
                    ),
                },
            }
        },
        "/api/jobs/{job_id}/fail": {
            "post": {
                "operationId": "failJob",
                "tags": ["worker"],
                "summary": "Fail a running job (retry with backoff or dead letter)",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("FailRequest")),
                "responses": job_answer,
            }
        },
        "/api/jobs/{job_id}/retry": {
            "post": {
                "operationId": "retryJob",
                "tags": ["jobs"],
                "summary": "Retry a failed, dead or discarded job now",
                "parameters": [JOB_ID],
                "responses": {"200": answer(ref("Job"), "The job, pending"), **JOB_ERRORS},
            }
        },
        "/api/jobs/{job_id}/discard": {
            "post": {
                "operationId": "discardJob",
                "tags": ["jobs"],
                "summary": "Discard a pending, failed or dead job",
                "parameters": [JOB_ID],
                "responses": {"200": answer(ref("Job"), "The job, discarded"), **JOB_ERRORS},
            }
        },
        "/api/jobs/{job_id}/cancel": {
            "post": {
                "operationId": "cancelJob",
                "tags": ["jobs"],
                "summary": "Cancel a pending, failed or running job (operators; audit-logged)",
                "parameters": [JOB_ID],
                "responses": {
                    "200": answer(ref("Job"), "The job, cancelled"),
                    "202": answer(
                        ref("CancelRequested"),
                        "The job is running: its cancel is requested, and it ends cancelled when its attempt "
                        "ends (the handler sees `ctx.cancelled`; an HTTP worker's heartbeat answers `cancel`)",
                    ),
                    **JOB_ERRORS,
                },
            }
        },
        "/api/stats": {
            "get": {
                "operationId": "getStats",
                "tags": ["jobs"],
                "summary": "Counts by state",
                "responses": {
                    "200": answer(ref("Stats"), "Counts"),
                    **UNAUTHORIZED,
                },
            }
        },
        "/api/stats/types": {
            "get": {
                "operationId": "getTypeHealth",
                "tags": ["jobs"],
                "summary": "Each job type's health over the last hour and day (from the per-minute counters)",
                "responses": {
                    "200": answer(
                        ref("TypeHealth"),
                        "Per window, per type: attempts completed and failed, jobs dead, run-time percentiles",
                    ),
                    **UNAUTHORIZED,
                },
            }
        },
        "/api/openapi.json": {
            "get": {
                "operationId": "getOpenapiDocument",
                "tags": ["process"],
                "summary": "This document",
                "security": [],
                "responses": {"200": answer({"type": "object", "additionalProperties": True}, "OpenAPI 3.1")},
            }
        },
    }
