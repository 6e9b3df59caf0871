"""OpenAPI of a job's log: ``GET /api/jobs/{job_id}/logs``, the heartbeat's
``logs`` field and ``logs_kept`` answer, and the ``logs`` summary of
``GET /api/jobs/{job_id}``; merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.core.validation import INT64_MAX
from jobdeck.jobs.joblogs import LEVELS, MAX_LINE_CHARS, MAX_LINES_PER_BEAT, TRUNCATED
from jobdeck.web.api.logs import MAX_PAGE
from jobdeck.web.api.openapi_common import ERRORS, JOB_ID, NO_JOB, answer, ref

SCHEMAS: dict[str, Any] = {
    "LogLine": {
        "type": "object",
        "required": ["id", "attempt", "seq", "at", "level", "message"],
        "properties": {
            "id": {"type": "integer", "description": "the line's place in the job's log; page on with `after`"},
            "attempt": {"type": "integer", "minimum": 1},
            "seq": {"type": "integer", "minimum": 1, "description": "the line's number in its attempt"},
            "at": {"type": "string", "format": "date-time"},
            "level": {
                "type": "string",
                "enum": [*LEVELS, TRUNCATED],
                "description": f"`{TRUNCATED}` marks the one line an attempt gets when it went past `[logs]`'s caps",
            },
            "message": {"type": "string", "maxLength": MAX_LINE_CHARS},
        },
    },
    "NewLogLine": {
        "type": "object",
        "description": "A line a worker logged, sent with a heartbeat, complete, fail or snooze",
        "required": ["message"],
        "additionalProperties": False,
        "properties": {
            "level": {"type": "string", "enum": [*LEVELS, "warn"], "default": "info"},
            "message": {
                "type": "string",
                "description": f"kept like a `ctx.log` line: NUL written as `\\x00`, cut at {MAX_LINE_CHARS} "
                "characters",
            },
            "at": {
                "type": "string",
                "format": "date-time",
                "description": "when it was logged; default: the beat's time",
            },
        },
    },
    "LogSummary": {
        "type": "object",
        "required": ["lines", "url"],
        "properties": {
            "lines": {"type": "integer", "minimum": 0, "description": "lines kept, every attempt's"},
            "url": {"type": "string", "description": "GET it for the lines"},
        },
    },
    "LogPage": {
        "type": "object",
        "required": ["logs", "next_after"],
        "properties": {
            "logs": {"type": "array", "items": ref("LogLine")},
            "next_after": {
                "type": ["integer", "null"],
                "description": "pass as `after` for the next page; null when this was the last",
            },
        },
    },
    "JobDetail": {
        "description": "A job with its attempts and the summary of its log",
        "allOf": [ref("Job"), {"type": "object", "required": ["logs"], "properties": {"logs": ref("LogSummary")}}],
    },
}


def _param(name: str, low: int, high: int, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": low, "maximum": high},
        "description": description,
    }


def paths() -> dict[str, Any]:
    return {
        "/api/jobs/{job_id}/logs": {
            "get": {
                "operationId": "getJobLogs",
                "tags": ["jobs"],
                "summary": "What the job's handler logged (ctx.log, captured logging, heartbeat lines), per attempt",
                "description": (
                    "Lines in the order they were stored. Page on with `after` = `next_after` while it is "
                    "not null; poll with the last `id` seen to follow a running job."
                ),
                "parameters": [
                    JOB_ID,
                    _param("attempt", 1, 2**31 - 1, "only this attempt's lines"),
                    _param("after", 0, INT64_MAX, "only lines after this `id` (default 0: from the first)"),
                    _param("limit", 1, MAX_PAGE, f"at most this many lines (default {MAX_PAGE})"),
                ],
                "responses": {
                    "200": answer(ref("LogPage"), "The lines"),
                    "401": ERRORS["401"],
                    "422": answer({"$ref": "#/components/schemas/Error"}, "A query parameter out of range"),
                    **NO_JOB,
                },
            }
        }
    }


def amend(doc: dict[str, Any]) -> None:
    """The ``logs`` of the heartbeat, complete, fail and snooze bodies, the
    heartbeat's ``logs_kept``, and the job with its ``logs`` summary."""
    schemas = doc["components"]["schemas"]
    schemas["HeartbeatRequest"]["properties"]["logs"] = {
        "type": "array",
        "maxItems": MAX_LINES_PER_BEAT,
        "items": ref("NewLogLine"),
        "description": "lines logged since the last beat, kept in the attempt's log under `[logs]`'s caps",
    }
    for body in ("CompleteRequest", "FailRequest", "SnoozeRequest"):
        schemas[body]["properties"]["logs"] = {
            "type": "array",
            "maxItems": MAX_LINES_PER_BEAT,
            "items": ref("NewLogLine"),
            "description": "the attempt's last lines, kept before the outcome, as with the heartbeat",
        }
    schemas["HeartbeatAnswer"]["allOf"][1]["properties"]["logs_kept"] = {
        "type": "integer",
        "minimum": 0,
        "description": "with `logs`: how many of them were kept (the rest went past a cap)",
    }
    shown = doc["paths"]["/api/jobs/{job_id}"]["get"]["responses"]["200"]
    shown["content"]["application/json"]["schema"] = ref("JobDetail")
