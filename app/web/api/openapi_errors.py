"""OpenAPI path of the errors grouping (``/api/errors``), merged into
``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.store.models import ERROR_STATES
from jobdeck.store.reads import MAX_ERROR_GROUPS
from jobdeck.web.api.openapi_common import UNAUTHORIZED, answer, ref

_TIME = {"type": "string", "format": "date-time"}

GROUP = {
    "type": "object",
    "required": ["type", "fingerprint", "count", "first_seen", "last_seen", "sample"],
    "properties": {
        "type": {"type": "string"},
        "fingerprint": {
            "type": ["string", "null"],
            "description": "the exception class and the first line of the message with quoted values, "
            "UUIDs, hex ids and numbers masked as `?`; null for jobs failed before fingerprints were stored",
        },
        "count": {"type": "integer", "minimum": 1},
        "first_seen": {
            **_TIME,
            "description": "when a job of the group first failed with its error, kept across retries",
        },
        "last_seen": {**_TIME, "description": "the latest failure of a job in the group"},
        "sample": {
            "type": "object",
            "required": ["id", "error"],
            "description": "the newest job in the group and its last error, as recorded",
            "properties": {"id": {"type": "integer"}, "error": {"type": ["string", "null"]}},
        },
    },
}


SCHEMAS: dict[str, Any] = {
    "ErrorState": {"type": "string", "enum": ERROR_STATES, "description": "The state an error group's jobs are in"},
    "ErrorGroup": GROUP,
    "ErrorGroups": {
        "type": "object",
        "required": ["status", "groups"],
        "properties": {
            "status": ref("ErrorState"),
            "groups": {"type": "array", "items": ref("ErrorGroup"), "maxItems": MAX_ERROR_GROUPS},
        },
    },
}


def paths() -> dict[str, Any]:
    return {
        "/api/errors": {
            "get": {
                "operationId": "listErrorGroups",
                "tags": ["jobs"],
                "summary": f"Dead (or failed) jobs grouped by type and error fingerprint, largest first "
                f"(at most {MAX_ERROR_GROUPS} groups)",
                "parameters": [
                    {
                        "name": "status",
                        "in": "query",
                        "required": False,
                        "schema": {**ref("ErrorState"), "default": "dead"},
                    }
                ],
                "responses": {
                    "200": answer(ref("ErrorGroups"), "Error groups"),
                    **UNAUTHORIZED,
                    "422": answer(ref("Error"), "An unknown `status`"),
                },
            }
        }
    }
