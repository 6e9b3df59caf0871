"""OpenAPI of the bulk enqueue (``jobdeck.web.api.bulk``): its path, its
request and answer schemas, and the ``index`` an error of one of its jobs
carries, merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.web.api.openapi_common import ERRORS, answer, new_jobs, ref, request_body

NEW_JOBS = new_jobs("NewJob", "1 to `max_bulk_jobs` jobs (1,000 by default), each as `POST /api/jobs` takes one")
ENQUEUED_JOB = {
    "type": "object",
    "required": ["id", "created", "duplicate", "replaced"],
    "properties": {
        "id": {"type": "integer", "description": "The job's id: new, or the existing job's"},
        "created": {"type": "boolean", "description": "This call inserted the job"},
        "duplicate": {
            "type": "boolean",
            "description": "A job held the unique key; `id` is that job (as `duplicate` of `POST /api/jobs`)",
        },
        "replaced": {
            "type": "boolean",
            "description": "With duplicate: its on_duplicate replace or debounce changed the kept job",
        },
    },
}
ENQUEUED_JOBS = {
    "type": "object",
    "required": ["jobs"],
    "properties": {"jobs": {"type": "array", "items": ref("EnqueuedJob"), "description": "One per job, in order"}},
}


def install(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    schemas["NewJobs"] = NEW_JOBS
    schemas["EnqueuedJob"] = ENQUEUED_JOB
    schemas["EnqueuedJobs"] = ENQUEUED_JOBS
    schemas["Error"]["properties"]["index"] = {
        "type": "integer",
        "description": "The job at fault, counted from 0 (a bulk enqueue)",
    }
    doc["paths"]["/api/jobs/bulk"] = {
        "post": {
            "operationId": "enqueueJobs",
            "tags": ["jobs"],
            "summary": "Enqueue many jobs in one transaction",
            "requestBody": request_body(ref("NewJobs")),
            "responses": {
                "201": answer(ref("EnqueuedJobs"), "Enqueued: one answer per job, in order"),
                "200": answer(ref("EnqueuedJobs"), "No job created: each was there already (key or unique)"),
                "409": answer(
                    ref("Error"),
                    "A job's idempotency_key belongs to a job with another type or payload (`field`, `index`); "
                    "nothing was inserted",
                ),
                **ERRORS,
                "413": answer(
                    ref("Error"),
                    "A job's payload is over `max_payload_bytes` (`field`, `index`), or the body over "
                    "`max_bulk_bytes`; nothing was inserted",
                ),
                "422": answer(
                    ref("Error"),
                    "An invalid job, named as `jobs[i].field` in `field` with `index` i, or `jobs` missing, "
                    "empty or longer than `max_bulk_jobs`; nothing was inserted",
                ),
            },
        }
    }
