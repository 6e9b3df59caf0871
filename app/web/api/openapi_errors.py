"""OpenAPI path of the errors grouping (``/api/errors``), merged into
``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.store.models import ERROR_STATES
from jobdeck.store.reads import MAX_ERROR_GROUPS
from jobdeck.web.api.openapi_common import ERRORS, UNAUTHORIZED, answer

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
        "first_seen": {**_TIME, "description": "the earliest last failure of a job in the group"},
        "last_seen": {**_TIME, "description": "the latest failure of a job in the group"},
        "sample": {
            "type": "object",
            "required": ["id", "error"],
            "description": "the newest job in the group and its last error, as recorded",
            "properties": {"id": {"type": "integer"}, "error": {"type": ["string", "null"]}},
        },
    },
}


def paths() -> dict[str, Any]:
    return {
        "/api/errors": {
            "get": {
                "summary": f"Dead (or failed) jobs grouped by type and error fingerprint, largest first "
                f"(at most {MAX_ERROR_GROUPS} groups)",
                "parameters": [
                    {
                        "name": "status",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ERROR_STATES, "default": "dead"},
                    }
                ],
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["status", "groups"],
                            "properties": {
                                "status": {"type": "string", "enum": ERROR_STATES},
                                "groups": {"type": "array", "items": GROUP, "maxItems": MAX_ERROR_GROUPS},
                            },
                        },
                        "Error groups",
                    ),
                    **UNAUTHORIZED,
                    "422": answer(ERRORS["422"]["content"]["application/json"]["schema"], "An unknown `status`"),
                },
            }
        }
    }
