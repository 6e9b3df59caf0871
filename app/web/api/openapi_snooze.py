"""OpenAPI paths of the HTTP worker's snooze and release
(``/api/jobs/{job_id}/snooze``, ``/api/jobs/{job_id}/release``) and the
snooze body's schema (a release's body is the effects' ``AttemptRequest``),
merged into ``jobdeck.web.api.openapi.document``."""

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
    },
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
        },
        "/api/jobs/{job_id}/release": {
            "post": {
                "operationId": "releaseJob",
                "tags": ["worker"],
                "summary": "Give a claimed job back at shutdown: pending at once, no retry counted",
                "description": "The job goes back to pending, due now, its retry count unchanged; the attempt is "
                "recorded `interrupted` (as a Python worker's graceful shutdown records it), not as a snooze, so "
                "`max_snoozes` is not touched. A job cancelled while it ran ends cancelled. Fenced by job, "
                "`attempt` and worker: a release of an attempt that is over, or of another worker's claim, "
                "is refused with 409, as a late complete is.",
                "parameters": [JOB_ID],
                "requestBody": request_body(ref("AttemptRequest")),
                "responses": {
                    "200": answer(ref("Job"), "The job as it now stands (pending, or cancelled)"),
                    **JOB_ERRORS,
                    "409": answer(
                        ref("Error"),
                        "The release is refused: the job is not running, is held by another worker, or is on a "
                        "later attempt than `attempt`",
                    ),
                },
            }
        },
    }
