"""OpenAPI paths of a job's artifacts (``/api/jobs/{job_id}/artifacts``),
merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.jobs.artifacts import MAX_NAME_BYTES
from jobdeck.web.api.openapi_common import ERRORS, JOB_ID, NO_JOB, answer, ref

ARTIFACT = {
    "type": "object",
    "required": ["name", "content_type", "size", "attempt", "created_at"],
    "properties": {
        "name": {"type": "string", "description": "the file name; download it at .../artifacts/{name}"},
        "content_type": {"type": "string"},
        "size": {"type": "integer", "minimum": 0, "description": "bytes"},
        "attempt": {"type": "integer", "description": "the attempt that stored it"},
        "created_at": {"type": "string", "format": "date-time"},
    },
}
_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_BYTES},
    "description": "An artifact's name: no / or \\, no control characters, at most 255 bytes of UTF-8",
}


SCHEMAS: dict[str, Any] = {
    "Artifact": ARTIFACT,
    "ArtifactList": {
        "type": "object",
        "required": ["artifacts"],
        "properties": {"artifacts": {"type": "array", "items": ref("Artifact")}},
    },
}


def paths() -> dict[str, Any]:
    return {
        "/api/jobs/{job_id}/artifacts": {
            "get": {
                "operationId": "listArtifacts",
                "tags": ["jobs"],
                "summary": "The files the job's handler kept (ctx.artifact), by name, without their bytes",
                "parameters": [JOB_ID],
                "responses": {
                    "200": answer(ref("ArtifactList"), "Artifacts, by name"),
                    "401": ERRORS["401"],
                    **NO_JOB,
                },
            }
        },
        "/api/jobs/{job_id}/artifacts/{name}": {
            "get": {
                "operationId": "downloadArtifact",
                "tags": ["jobs"],
                "summary": "Download one artifact: its bytes, with its content type and file name",
                "description": (
                    "Sent with `Content-Disposition: attachment` (RFC 6266, the name also as `filename*`) "
                    "unless it is a PNG, JPEG, GIF, WebP image or plain text, and always with "
                    "`X-Content-Type-Options: nosniff` and a sandboxing Content-Security-Policy."
                ),
                "parameters": [JOB_ID, _NAME],
                "responses": {
                    "200": {
                        "description": "The artifact's bytes",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "401": ERRORS["401"],
                    "404": answer(ref("Error"), "Unknown job, or no artifact of that name"),
                    "422": answer(ref("Error"), "A name no artifact can have"),
                },
            }
        },
    }
