"""OpenAPI paths of the runtime schedules (``POST /api/schedules``, ``PUT`` and
``DELETE /api/schedules/{name}``), merged into ``jobdeck.web.api.openapi.document``,
and the schedule's health and definition as ``GET /api/schedules`` carries them."""

from __future__ import annotations

from typing import Any

from jobdeck.web.api.openapi_common import ERRORS, FORBIDDEN, answer, nullable, ref, request_body, text

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
        "payload": {"type": "object", "additionalProperties": True, "default": {}},
        "priority": {"type": ["integer", "string"]},
        "queue": {"type": "string"},
        "max_retries": {"type": "integer", "minimum": 0},
        "enabled": {"type": "boolean", "default": True},
        "misfire": {**ref("Misfire"), "default": "run_once"},
        "misfire_grace": {"type": "number", "minimum": 0, "default": 3600},
        "expect_success_within": _DURATION,
        "alert_after_failures": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
    "additionalProperties": False,
}
UPDATE = {**ENTRY, "required": ["cron", "type"], "description": "the whole new definition; `name`, if given, "
          "must be the schedule's own (a rename is a create and a delete)"}  # fmt: skip


def schemas(base: dict[str, Any]) -> dict[str, Any]:
    """``Schedule``: the schedule of ``GET /api/schedules`` (``base``) with its
    source, health and definition; and the schemas that these add."""
    return {
        "Schedule": {
            **base,
            "properties": {
                **base["properties"],
                "source": {"enum": ["config", "runtime", None], "description": "null once removed"},
                "health": ref("ScheduleHealth"),
                "definition": {**nullable("ScheduleEntry"), "description": "a runtime schedule's entry"},
            },
        },
        "ScheduleHealth": HEALTH,
        "Misfire": {
            "type": "string",
            "enum": ["run_once", "skip"],
            "description": "After a fire time was missed (the process was down): run once, or skip to the next",
        },
        "ScheduleEntry": ENTRY,
        "ScheduleUpdate": UPDATE,
        "ScheduleDeleted": {
            "type": "object",
            "required": ["deleted"],
            "properties": {"deleted": {"type": "string", "description": "the schedule's name"}},
        },
    }


def paths() -> dict[str, Any]:
    conflict = {"409": answer(ref("Error"), "A config schedule's name (config is its source of truth), a name "
                             "taken, or an edit that raced another")}  # fmt: skip
    unknown = {"404": answer(ref("Error"), "No runtime schedule of that name")}
    return {
        "/api/schedules": {
            "post": {
                "operationId": "createSchedule",
                "tags": ["schedules"],
                "summary": "Create a runtime schedule (audit-logged); every process fires it within a poll interval",
                "requestBody": request_body(ref("ScheduleEntry")),
                "responses": {"201": answer(ref("Schedule"), "The schedule"), **ERRORS, **conflict},
            }
        },
        "/api/schedules/{name}": {
            "put": {
                "operationId": "replaceSchedule",
                "tags": ["schedules"],
                "summary": "Replace a runtime schedule's definition (audit-logged with a before/after diff)",
                "parameters": [_NAME],
                "requestBody": request_body(ref("ScheduleUpdate")),
                "responses": {
                    "200": answer(ref("Schedule"), "The schedule"),
                    **ERRORS,
                    **unknown,
                    **conflict,
                    "403": FORBIDDEN,
                },  # fmt: skip
            },
            "delete": {
                "operationId": "deleteSchedule",
                "tags": ["schedules"],
                "summary": "Delete a runtime schedule; its past runs stay listed (audit-logged)",
                "parameters": [_NAME],
                "responses": {
                    "200": answer(ref("ScheduleDeleted"), "Deleted"),
                    **ERRORS,
                    **unknown,
                    **conflict,
                    "403": FORBIDDEN,
                },
            },
        },
    }
