"""OpenAPI paths of the effects ledger (``/api/jobs/{job_id}/effects``),
merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.core.states import EFFECT_RESOLUTIONS, EffectState
from jobdeck.web.api.openapi_common import ERRORS, JOB_ID, TIME, answer, ref, request_body

EFFECT = {
    "type": "object",
    "required": ["key", "state", "job_id", "attempt", "created_at", "result"],
    "properties": {
        "key": {"type": "string"},
        "state": {
            "type": "string",
            "enum": [s.value for s in EffectState],
            "description": "started: outcome unknown until done or not_performed",
        },
        "job_id": {"type": ["integer", "null"]},
        "attempt": {"type": ["integer", "null"], "description": "the attempt that started it"},
        "worker_id": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": TIME,
        "finished_at": TIME,
        "result": {"description": "what the effect returned (JSON), when done"},
        "resolved_by": {"type": ["string", "null"], "description": "who marked it, if a person did"},
    },
}
_KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
_MISSING = {"404": answer(ref("Error"), "Unknown job, or no such effect of the job")}
_REFUSED = {"409": answer(ref("Error"), "The effect is not started (its outcome is known)")}


SCHEMAS: dict[str, Any] = {
    "Effect": EFFECT,
    "EffectList": {
        "type": "object",
        "required": ["effects"],
        "properties": {"effects": {"type": "array", "items": ref("Effect")}},
    },
    "EffectResolution": {
        "type": "object",
        "required": ["outcome"],
        "properties": {
            "outcome": {"type": "string", "enum": sorted(s.value for s in EFFECT_RESOLUTIONS)},
            "result": {"description": "with done: what the retry's ctx.effect returns"},
        },
    },
}


def paths() -> dict[str, Any]:
    return {
        "/api/jobs/{job_id}/effects": {
            "get": {
                "operationId": "listEffects",
                "tags": ["jobs"],
                "summary": "The effects the job's attempts started (the effects ledger)",
                "parameters": [JOB_ID],
                "responses": {
                    "200": answer(ref("EffectList"), "Effects, oldest first"),
                    "401": ERRORS["401"],
                    **_MISSING,
                },
            }
        },
        "/api/jobs/{job_id}/effects/{key}/resolve": {
            "post": {
                "operationId": "resolveEffect",
                "tags": ["jobs"],
                "summary": "Mark an unknown (started) effect done or not performed, then retry the job",
                "parameters": [JOB_ID, _KEY],
                "requestBody": request_body(ref("EffectResolution")),
                "responses": {
                    "200": answer(ref("Effect"), "The effect as it now stands"),
                    **ERRORS,
                    **_MISSING,
                    **_REFUSED,
                },
            }
        },
    }
