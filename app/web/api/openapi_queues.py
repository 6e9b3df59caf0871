"""OpenAPI paths of the queue and schedule controls (``/api/queues``,
``/api/schedules``) and the queue's and schedule's schemas, merged into
``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.web.api.openapi_common import ERRORS, UNAUTHORIZED, UNSUPPORTED, answer, ref, text

_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 200}}
_QUEUE_NAME = {"name": "name", "in": "path", "required": True, "schema": text(100)}
_TIME = {"type": ["string", "null"], "format": "date-time"}

QUEUE = {
    "type": "object",
    "required": ["name", "paused", "waiting", "running", "concurrency"],
    "properties": {
        "name": {"type": "string"},
        "paused": {"type": "boolean"},
        "waiting": {"type": "integer", "description": "pending (due or scheduled) and failed awaiting retry"},
        "running": {"type": "integer"},
        "concurrency": {"type": ["integer", "null"], "description": "the queue's limit, if any"},
        "limits": {"type": "array", "items": ref("FlowLimit"), "description": "its flow limits, when it has any"},
    },
}
_USE_TEXT = {"type": "string", "description": 'the use in words: "37 of 100 in the last 60 s", "3 keys at their limit"'}
FLOW_LIMIT = {
    "type": "object",
    "description": "A rate limit and/or a concurrency per key of one queue or job type (jobdeck.jobs.flow), with its use now",
    "required": ["scope", "name", "closed_until"],
    "properties": {
        "scope": {"enum": ["queue", "type"]},
        "name": {"type": "string"},
        "rate": {
            "type": "object",
            "required": ["limit", "window_seconds", "key", "used", "keys_at_limit", "text"],
            "properties": {
                "limit": {"type": "integer", "description": "starts allowed per window"},
                "window_seconds": {"type": "number"},
                "key": {"type": ["string", "null"], "description": "the payload path it is per, if keyed"},
                "used": {"type": ["integer", "null"], "description": "starts in the last window (unkeyed)"},
                "keys_at_limit": {"type": ["integer", "null"], "description": "keys with no start left (keyed)"},
                "text": _USE_TEXT,
            },
        },
        "concurrency_per_key": {
            "type": "object",
            "required": ["limit", "key", "keys_running", "keys_at_limit", "text"],
            "properties": {
                "limit": {"type": "integer", "description": "running jobs allowed per key"},
                "key": {"type": "string"},
                "keys_running": {"type": "integer"},
                "keys_at_limit": {"type": "integer"},
                "text": _USE_TEXT,
            },
        },
        "closed_until": {**_TIME, "description": "closed by a handler (ctx.rate_limited) until then, if so"},
        "closed_text": {"type": ["string", "null"]},
    },
}
RUN = {
    "type": "object",
    "required": ["fire_time", "job_id", "manual", "status"],
    "properties": {
        "fire_time": {"type": "string", "format": "date-time"},
        "job_id": {"type": ["integer", "null"]},
        "manual": {"type": "boolean", "description": "enqueued by Run now"},
        "status": {"type": "string", "description": "the job's state, or `pruned` after retention"},
    },
}
SCHEDULE = {
    "type": "object",
    "required": ["name", "configured", "description", "paused", "enabled", "next_run", "runs"],
    "properties": {
        "name": {"type": "string"},
        "configured": {"type": "boolean", "description": "false once removed from config (history stays)"},
        "cron": {"type": ["string", "null"]},
        "description": {"type": "string", "description": "the cron in words, with its time zone"},
        "timezone": {"type": ["string", "null"]},
        "type": {"type": ["string", "null"]},
        "enabled": {"type": "boolean"},
        "paused": {"type": "boolean"},
        "next_run": _TIME,
        "runs": {"type": "array", "items": ref("ScheduleRun"), "description": "most recent first"},
    },
}
_UNKNOWN = {"404": answer(ref("Error"), "No such schedule")}
_ACTION_ERRORS = {**UNAUTHORIZED, **UNSUPPORTED}
"""An action without a body: a body, if any, must still be JSON (415)."""


SCHEMAS: dict[str, Any] = {
    "Queue": QUEUE,
    "FlowLimit": FLOW_LIMIT,
    "QueueList": {
        "type": "object",
        "required": ["queues", "limits"],
        "properties": {
            "queues": {"type": "array", "items": ref("Queue")},
            "limits": {"type": "array", "items": ref("FlowLimit")},
        },
    },
    "ScheduleRun": RUN,
    "ScheduleList": {
        "type": "object",
        "required": ["schedules"],
        "properties": {"schedules": {"type": "array", "items": ref("Schedule")}},
    },
}
"""The schemas of these paths; ``Schedule`` is ``SCHEDULE`` completed by ``openapi_schedules``."""


def paths() -> dict[str, Any]:
    def queue_action(operation_id: str, summary: str) -> dict[str, Any]:
        return {"post": {"operationId": operation_id, "tags": ["queues"], "summary": summary,
                         "parameters": [_QUEUE_NAME],
                         "responses": {"200": answer(ref("Queue"), "The queue"), **_ACTION_ERRORS,
                                       "422": ERRORS["422"]}}}  # fmt: skip

    def schedule_action(operation_id: str, summary: str) -> dict[str, Any]:
        return {"post": {"operationId": operation_id, "tags": ["schedules"], "summary": summary,
                         "parameters": [_NAME],
                         "responses": {"200": answer(ref("Schedule"), "The schedule"), **_ACTION_ERRORS,
                                       **_UNKNOWN}}}  # fmt: skip

    return {
        "/api/queues": {
            "get": {
                "operationId": "listQueues",
                "tags": ["queues"],
                "summary": "Queues with waiting or running jobs, paused or limited",
                "responses": {"200": answer(ref("QueueList"), "Queues"), **UNAUTHORIZED},
            }
        },
        "/api/queues/{name}/pause": queue_action(
            "pauseQueue", "Pause a queue: nothing more is claimed from it; running jobs finish"
        ),
        "/api/queues/{name}/resume": queue_action("resumeQueue", "Resume a paused queue"),
        "/api/schedules": {
            "get": {
                "operationId": "listSchedules",
                "tags": ["schedules"],
                "summary": "Schedules (from config and made at runtime, and removed ones with history), their "
                "next and recent runs and their health",
                "responses": {"200": answer(ref("ScheduleList"), "Schedules"), **UNAUTHORIZED},
            }
        },
        "/api/schedules/{name}/run": {
            "post": {
                "operationId": "runSchedule",
                "tags": ["schedules"],
                "summary": "Run now: enqueue one job of the schedule at once",
                "parameters": [_NAME],
                "responses": {"201": answer(ref("Job"), "The job"), **_ACTION_ERRORS, **_UNKNOWN},
            }
        },
        "/api/schedules/{name}/pause": schedule_action("pauseSchedule", "Pause a schedule (recorded in the audit log)"),
        "/api/schedules/{name}/resume": schedule_action(
            "resumeSchedule", "Resume a schedule; fire times missed while paused are not replayed"
        ),
    }
