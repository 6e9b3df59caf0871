"""OpenAPI of unique jobs (``jobdeck.jobs.unique``): the ``unique`` field of an
enqueue, the job's ``unique_key``, and the 200 duplicate answer, merged into
``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.jobs.unique import (
    DEFAULT_BY,
    DEFAULT_STATES,
    MAX_BY,
    MAX_PATH_SEGMENTS,
    MAX_SECONDS,
    ON_DUPLICATE,
    STATE_BITS,
)

_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS}
_FIELD_CHARS = len("payload") + MAX_PATH_SEGMENTS * 65
"""The longest field name (no pattern here: the fuzzer spent its budget on
strings that miss a nested one; the README and the 422s state the form)."""

UNIQUE = {
    "description": "Make this job unique (README: Unique jobs): `true` for the defaults, `false` to turn off "
    "the type's `unique`, or the options. A duplicate answers 200 with the kept job and `duplicate: true`. "
    "Not with idempotency_key.",
    "anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/UniqueOptions"}],
}
UNIQUE_OPTIONS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "by": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BY,
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1, "maxLength": _FIELD_CHARS},
            "default": list(DEFAULT_BY),
            "description": "The fields of the key: type, queue, payload, or payload.<path> (1-8 "
            "segments of A-Z a-z 0-9 _ -) naming a string, number, boolean or null in the payload "
            "(422 otherwise)",
        },
        "period": {**_SECONDS, "description": "Seconds from the first enqueue; left out: no end"},
        "states": {
            "type": "array",
            "minItems": 1,
            "items": {"enum": list(STATE_BITS)},
            "default": list(DEFAULT_STATES),
            "description": "The states the kept job holds its key in; scheduled is pending and not yet due",
        },
        "on_duplicate": {"enum": list(ON_DUPLICATE), "default": "keep"},
        "debounce": {**_SECONDS, "description": "Run the kept job this long after the latest enqueue"},
    },
}


def install(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    schemas["UniqueOptions"] = UNIQUE_OPTIONS
    schemas["NewJob"]["properties"]["unique"] = UNIQUE
    job = schemas["Job"]["properties"]
    job["unique_key"] = {"type": ["string", "null"], "description": "The unique key, if enqueued unique"}
    job["duplicate"] = {
        "type": "boolean",
        "description": "Only in an enqueue's 200, and then true: a job held the unique key; this is that job",
    }
    job["replaced"] = {
        "type": "boolean",
        "description": "With duplicate: its on_duplicate replace or debounce changed the kept job",
    }
    responses = doc["paths"]["/api/jobs"]["post"]["responses"]
    responses["200"]["description"] = (
        "The existing job: the one with this idempotency_key, or the job holding the unique key "
        "(then `duplicate: true`)"
    )
