"""OpenAPI path of the HTTP worker's snooze (``/api/jobs/{job_id}/snooze``)
and its body's schema, merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.jobs.snooze import MAX_REASON_CHARS, MAX_SNOOZE_SECONDS
from jobdeck.web.api.openapi_common import JOB_ERRORS, JOB_ID, WORKER_ID, answer, ref, request_body, text

SCHEMAS: dict[str, Any] = {
    "SnoozeRequest": {
        "type": "object",
        "required": ["worker_id", "seconds"],
        "properties": {
            "worker_id": WORKER_ID,
            "seconds": {"type": "number", "minimum": 0, "maximum": MAX_SNOOZE_SECONDS},
            "reason": text(MAX_REASON_CHARS, 0),
        },
    }
}


def paths() -> dict[str, Any]:
    return {
        "/api/jobs/{job_id}/snooze": {
            "post": {
                "operationId": "snoozeJob",
                "tags": ["worker"],
                "summary": "Snooze a running job: run it again later, no retry or failure counted",
                "description": "The job goes back to pending, due `seconds` from now, its retry count unchanged; "
                "the attempt is recorded `snoozed` with `snooze_seconds`. A job cancelled while it ran ends "
                "cancelled. Past the type's `max_snoozes` in a row the attempt fails instead (the fail rule).",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("SnoozeRequest")),
                "responses": {"200": answer(ref("Job"), "The job as it now stands (pending)"), **JOB_ERRORS},
            }
        }
    }
