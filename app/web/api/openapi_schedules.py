"""OpenAPI paths of the runtime schedules (``POST /api/schedules``, ``PUT`` and
``DELETE /api/schedules/{name}``), merged into ``jobdeck.web.api.openapi.document``,
and the schedule's health as ``GET /api/schedules`` carries it."""

from __future__ import annotations

from typing import Any

from jobdeck.web.api.openapi_common import ERRORS, FORBIDDEN, answer, ref, request_body, text

_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 200}}
_TIME = {"type": ["string", "null"], "format": "date-time"}
_DURATION = {
    "type": ["string", "number"],
    "description": 'a duration such as "26h", "90m", "1h30m", "3s", or a number of seconds',
}

HEALTH = {
    "type": "object",
    "required": ["watched", "healthy"],
    "description": "the dead man's switch: watched when the schedule sets expect_success_within or "
    "alert_after_failures",
    "properties": {
        "watched": {"type": "boolean"},
        "healthy": {"type": "boolean"},
        "reason": {"type": ["string", "null"], "description": "why it is unhealthy"},
        "unhealthy_since": _TIME,
        "last_success": _TIME,
        "expect_success_within": {"type": ["number", "null"], "description": "seconds"},
        "alert_after_failures": {"type": ["integer", "null"]},
    },
}
ENTRY = {
    "type": "object",
    "required": ["name", "cron", "type"],
    "description": "a schedule as a [[schedules]] entry of the config file, validated by the same rule",
    "properties": {
        "name": text(200),
        "cron": {"type": "string", "maxLength": 200, "description": "5 crontab fields, or 6 with seconds first"},
        "timezone": {"type": "string", "maxLength": 100, "default": "UTC", "description": "an IANA zone"},
        "type": {"type": "string", "description": "a registered job type"},
        "payload": {"type": "object", "default": {}},
        "priority": {"type": ["integer", "string"]},
        "queue": {"type": "string"},
        "max_retries": {"type": "integer", "minimum": 0},
        "enabled": {"type": "boolean", "default": True},
        "misfire": {"enum": ["run_once", "skip"], "default": "run_once"},
        "misfire_grace": {"type": "number", "minimum": 0, "default": 3600},
        "expect_success_within": _DURATION,
        "alert_after_failures": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
    "additionalProperties": False,
}
UPDATE = {**ENTRY, "required": ["cron", "type"], "description": "the whole new definition; `name`, if given, "
          "must be the schedule's own (a rename is a create and a delete)"}  # fmt: skip


def schedule_schema(base: dict[str, Any]) -> dict[str, Any]:
    """The schedule of ``GET /api/schedules`` with its source, health and definition."""
    return {
        **base,
        "properties": {
            **base["properties"],
            "source": {"enum": ["config", "runtime", None], "description": "null once removed"},
            "health": HEALTH,
            "definition": {"oneOf": [ENTRY, {"type": "null"}], "description": "a runtime schedule's entry"},
        },
    }


def paths(schedule: dict[str, Any]) -> dict[str, Any]:
    conflict = {"409": answer(ref("Error"), "A config schedule's name (config is its source of truth), a name "
                             "taken, or an edit that raced another")}  # fmt: skip
    unknown = {"404": answer(ref("Error"), "No runtime schedule of that name")}
    return {
        "/api/schedules": {
            "post": {
                "summary": "Create a runtime schedule (audit-logged); every process fires it within a poll interval",
                "requestBody": request_body(ENTRY),
                "responses": {"201": answer(schedule, "The schedule"), **ERRORS, **conflict},
            }
        },
        "/api/schedules/{name}": {
            "put": {
                "summary": "Replace a runtime schedule's definition (audit-logged with a before/after diff)",
                "parameters": [_NAME],
                "requestBody": request_body(UPDATE),
                "responses": {
                    "200": answer(schedule, "The schedule"),
                    **ERRORS,
                    **unknown,
                    **conflict,
                    "403": FORBIDDEN,
                },  # fmt: skip
            },
            "delete": {
                "summary": "Delete a runtime schedule; its past runs stay listed (audit-logged)",
                "parameters": [_NAME],
                "responses": {
                    "200": answer(
                        {"type": "object", "required": ["deleted"], "properties": {"deleted": {"type": "string"}}},
                        "Deleted",
                    ),
                    **ERRORS,
                    **unknown,
                    **conflict,
                    "403": FORBIDDEN,
                },
            },
        },
    }
