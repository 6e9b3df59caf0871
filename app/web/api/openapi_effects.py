"""OpenAPI paths of the effects ledger (``/api/jobs/{job_id}/effects``):
an HTTP worker's steps (start, finish, withdraw) and an operator's (list,
resolve), merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.core.states import EFFECT_RESOLUTIONS, EffectState
from jobdeck.core.validation import MAX_JSON_DEPTH
from jobdeck.jobs.effects import Decision
from jobdeck.web.api.jobs import MAX_ATTEMPT
from jobdeck.web.api.openapi_common import ERRORS, JOB_ID, NO_JOB, TIME, WORKER_ID, answer, ref, request_body

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
_ATTEMPT = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_ATTEMPT,
    "description": "The attempt the claim answered (the job's `attempt`): the step is for it only",
}
_STEP = {"worker_id": WORKER_ID, "attempt": _ATTEMPT}
_DECISIONS = {
    Decision.PERFORM: "the key is started by your attempt: perform the side effect, then finish (done, "
    "with its result) or withdraw (certainly not performed)",
    Decision.SKIP: "the effect is done already (an earlier attempt, or another job): do not perform it; "
    "`effect.result` is its result",
    Decision.WAIT: "another job's running attempt is performing it now: start again in a moment",
}
_TOO_LARGE = {
    "413": answer(ref("Error"), "The request body is over the server's cap, or the result over `max_result_bytes`")
}


SCHEMAS: dict[str, Any] = {
    "Effect": EFFECT,
    "EffectStartRequest": {
        "type": "object",
        "required": ["worker_id", "attempt"],
        "properties": {
            **_STEP,
            "replay_safe": {
                "type": "boolean",
                "description": "The downstream deduplicates by this key itself (forward the key to it): an "
                "unknown outcome is performed again instead of sending the job to dead",
            },
        },
    },
    "EffectStart": {
        "type": "object",
        "required": ["decision", "effect", "replayed"],
        "properties": {
            "decision": {
                "type": "string",
                "enum": list(_DECISIONS),
                "description": "; ".join(f"{d.value}: {why}" for d, why in _DECISIONS.items()),
            },
            "effect": ref("Effect"),
            "replayed": {
                "type": "boolean",
                "description": "With perform and replay_safe: an earlier attempt's outcome was unknown",
            },
        },
    },
    "EffectUnknown": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {"type": "string", "description": "Why the attempt ended"},
            "job_id": {"type": "integer"},
            "status": {"type": "string", "description": "The job's state now: dead (cancelled if cancelled)"},
            "effect": ref("Effect"),
            "state": {"type": "string", "description": "A refused finish or withdraw: the effect's state"},
        },
        "description": "A refusal: the job is not running, is held by another worker or attempt, or (with "
        "`effect`) the effect's outcome is unknown and the attempt ended, the job dead for a person",
    },
    "EffectFinishRequest": {
        "type": "object",
        "required": ["worker_id", "attempt"],
        "properties": {
            **_STEP,
            "result": {
                "description": f"What the side effect returned: any JSON, at most {MAX_JSON_DEPTH} levels deep "
                "and `max_result_bytes` (default 1 MiB) as compact UTF-8 JSON; later attempts read it"
            },
        },
    },
    "AttemptRequest": {
        "type": "object",
        "description": "The worker and the claimed attempt a call is for (an effect's withdraw, a release)",
        "required": ["worker_id", "attempt"],
        "properties": _STEP,
    },
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


def _step(operation_id: str, summary: str, body: str, answer_is: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation_id,
            "tags": ["effects"],
            "summary": summary,
            "parameters": [JOB_ID, _KEY],
            "requestBody": request_body(ref(body)),
            "responses": {
                "200": answer(ref(answer_is), "The step's answer"),
                **ERRORS,
                **NO_JOB,
                **extra,
            },
        }
    }


def paths() -> dict[str, Any]:
    refused = "The worker's attempt is over (the job is not running, or another worker or attempt holds it)"
    return {
        "/api/jobs/{job_id}/effects/{key}/start": _step(
            "startEffect",
            "Record an effect started by your attempt before performing it, or learn it is done already",
            "EffectStartRequest",
            "EffectStart",
            {
                "409": answer(
                    ref("EffectUnknown"),
                    f"{refused}; or, with `effect`, an earlier attempt started it and its outcome is unknown: "
                    "your attempt was failed and the job is dead (report nothing more)",
                )
            },
        ),
        "/api/jobs/{job_id}/effects/{key}/finish": _step(
            "finishEffect",
            "Mark the effect your attempt started done, with its result",
            "EffectFinishRequest",
            "Effect",
            {
                **_TOO_LARGE,
                "404": answer(ref("Error"), "Unknown job, or no such effect of the job"),
                "409": answer(ref("Error"), "Another attempt started the effect, or its state cannot become done"),
            },
        ),
        "/api/jobs/{job_id}/effects/{key}/withdraw": _step(
            "withdrawEffect",
            "Withdraw the effect your attempt started: it was certainly not performed",
            "AttemptRequest",
            "Effect",
            {
                "404": answer(ref("Error"), "Unknown job, or no such effect of the job"),
                "409": answer(ref("Error"), "Another attempt started the effect, or it is not started"),
            },
        ),
        "/api/jobs/{job_id}/effects": {
            "get": {
                "operationId": "listEffects",
                "tags": ["effects"],
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
                "tags": ["effects"],
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
