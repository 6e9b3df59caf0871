"""The core schemas of the OpenAPI document: the job, its attempts, a new job,
an edit, the error, the per-type health; the parts add to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobdeck.core.states import PRIORITY_LABELS
from jobdeck.core.validation import MAX_JSON_DEPTH, MAX_PRIORITY, MAX_QUEUE_CHARS, MAX_TYPE_CHARS, PRIORITY_NUMBER
from jobdeck.jobs.intake import MAX_DELAY_SECONDS, MAX_KEY_CHARS, MAX_RETRIES
from jobdeck.jobs.waiting import WAITING_CODES
from jobdeck.store.models import OUTCOMES
from jobdeck.web.api.openapi_common import JOB_STATE, STATUS, TIME, nullable, ref, text


def job_type(types: Sequence[str] = ()) -> dict[str, Any]:
    """``NewJob.type``: a plain bounded string, never an enum, so a client
    generated today still enqueues a type registered tomorrow; the types this
    deployment accepts now are its ``examples``."""
    schema: dict[str, Any] = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TYPE_CHARS,
        "description": "A registered handler's name or one of `external_types` (422 otherwise); "
        "`examples` lists the types this deployment accepts now",
    }
    if types:
        schema["examples"] = sorted(types)
    return schema


def schemas(types: Sequence[str] = ()) -> dict[str, Any]:
    """``types`` are the job types this deployment accepts, given as
    ``NewJob.type``'s examples."""
    return {
        "JobState": JOB_STATE,
        "PriorityLabel": {"type": "string", "enum": list(PRIORITY_LABELS)},
        "Priority": {
            "description": "An integer, or a label in any case: "
            + ", ".join(f"{k} {v}" for k, v in PRIORITY_LABELS.items()),
            "anyOf": [
                {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
                ref("PriorityLabel"),
                {"type": "string", "pattern": f"^{PRIORITY_NUMBER.pattern}$"},
            ],
        },
        "WaitingReason": {
            "type": "object",
            "description": "Why a pending or failed job is not running yet (app/jobs/waiting.py: the code's "
            "details beside code and a plain-text message)",
            "required": ["code", "message"],
            "properties": {"code": {"enum": list(WAITING_CODES)}, "message": {"type": "string"}},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {"type": "string", "description": "What was wrong, in words"},
                "field": {"type": "string", "description": "The request field at fault"},
                "job_id": {"type": "integer", "description": "The job concerned (a conflict)"},
                "scope": {"type": "string", "description": "The scope the token lacks (403)"},
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
                "started_at": TIME,
                "finished_at": TIME,
                "duration_seconds": {"type": ["number", "null"]},
                "outcome": {"type": "string", "enum": list(OUTCOMES)},
                "error": {"type": ["string", "null"]},
                "traceback": {"type": ["string", "null"]},
                "payload": {"type": ["object", "null"], "additionalProperties": True},
                "snooze_seconds": {
                    "type": ["number", "null"],
                    "description": "how long a `snoozed` attempt put its job off",
                },
                "executor": {
                    "type": ["string", "null"],
                    "enum": ["thread", "async", "process", None],
                    "description": "what ran the attempt; null for one the pool did not finish (released, rescued)",
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
                "attempt",
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
                "payload": {"type": "object", "additionalProperties": True},
                "priority": {"type": "integer"},
                "priority_label": ref("PriorityLabel"),
                "status": STATUS,
                "scheduled": {"type": "boolean", "description": "pending and not yet due"},
                "attempt": {
                    "type": "integer",
                    "description": "The latest claim's attempt number (0 before the first): a worker names it "
                    "in an effect's start, finish and withdraw",
                },
                "retry_count": {"type": "integer"},
                "max_retries": {"type": "integer"},
                "idempotency_key": {"type": ["string", "null"]},
                "available_at": TIME,
                "claimed_at": TIME,
                "heartbeat_at": TIME,
                "worker_id": {"type": ["string", "null"]},
                "error": {"type": ["string", "null"]},
                "result": {},
                "progress": {"type": ["number", "null"]},
                "progress_message": {"type": ["string", "null"]},
                "created_at": TIME,
                "updated_at": TIME,
                "finished_at": TIME,
                "traceparent": {
                    "type": ["string", "null"],
                    "description": "The W3C trace context the job was enqueued in, with tracing on: a worker "
                    "continues the trace with it (the parent of its attempt's span)",
                },
                "attempts": {"type": "array", "items": ref("Attempt")},
                "waiting_reason": {
                    **nullable("WaitingReason"),
                    "description": "why a pending or failed job is not running yet; null when nothing holds it back",
                },
            },
        },
        "NewJob": {
            "type": "object",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": job_type(types),
                "payload": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": f"At most `max_payload_bytes` as compact UTF-8 JSON (413 past it), "
                    f"at most {MAX_JSON_DEPTH} levels deep, finite numbers only",
                },
                "priority": ref("Priority"),
                "max_retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES},
                "idempotency_key": text(MAX_KEY_CHARS),
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
                "queue": text(MAX_QUEUE_CHARS),
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
                    "additionalProperties": True,
                    "description": "Replaces the payload (same limits as an enqueue); the attempts that "
                    "ran keep the old one",
                },
                "priority": ref("Priority"),
                "queue": text(MAX_QUEUE_CHARS),
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
    }
