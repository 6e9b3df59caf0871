"""The OpenAPI 3.1 document of the JSON API, served at /api/openapi.json.

Assembled here from its parts: the core schemas (``openapi_schemas``), each
area's paths (``openapi_jobs``, ``openapi_queues``, ...) and what they share
(``openapi_common``). The parts import only ``openapi_common`` and the routes'
own limits, never this module, so the arrows point one way.

Kept true by tests/test_openapi.py: every /api route is documented, every
documented path exists, and real responses validate against these schemas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flask import current_app, jsonify, request
from jobdeck.deck import Jobdeck
from jobdeck.web import scopes
from jobdeck.web.api import (
    openapi_artifacts,
    openapi_bulk,
    openapi_effects,
    openapi_errors,
    openapi_jobs,
    openapi_lists,
    openapi_logs,
    openapi_metrics,
    openapi_payloads,
    openapi_queues,
    openapi_schedules,
    openapi_snooze,
    openapi_unique,
    openapi_workers,
    openapi_workflows,
)
from jobdeck.web.api.jobs import bp
from jobdeck.web.api.openapi_common import FORBIDDEN, FULL, UNAUTHORIZED, UNAVAILABLE
from jobdeck.web.api.openapi_schemas import schemas

TAGS = [
    {"name": "jobs", "description": "Enqueue, read and act on jobs: their logs, artifacts and errors"},
    {"name": "worker", "description": "The protocol of a worker in any language: claim, heartbeat, complete, fail"},
    {
        "name": "effects",
        "description": "The effects ledger: a worker's side effects, at most once (start, finish, withdraw), "
        "and an operator's word on an unknown one",
    },
    {"name": "workflows", "description": "Jobs that wait for other jobs"},
    {"name": "batches", "description": "Jobs whose callbacks run once all of them ended"},
    {"name": "queues", "description": "Queues: their load and limits; pause and resume"},
    {"name": "schedules", "description": "Recurring jobs: from config and made at runtime"},
    {"name": "process", "description": "This process and the worker pools: health, metrics, workers and this document"},
]
"""Every operation has one of these tags (a generated client's module) and an
``operationId`` (its function), tests/test_openapi.py checks."""


BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "A named token from `[api_tokens.NAME]` (`jobdeck token create`), which may call the "
    "operations of its scopes (`enqueue`, `work`, `read`, `operate`: each operation's `x-scopes` and "
    "`security` name the scopes that grant it; 403 otherwise), or the legacy `api_token`, which may call all.",
}


def document(types: Sequence[str] = (), payloads: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The document; ``types`` are the job types this deployment accepts
    (registered handlers and ``external_types``), given as examples of
    ``NewJob.type``, which stays a plain string; ``payloads`` the payload
    schemas of typed handlers, by type (``openapi_payloads``)."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Jobdeck API", "version": "1"},
        "tags": TAGS,
        "components": {
            "securitySchemes": {"bearer": BEARER},
            "schemas": schemas(types),
        },
        "security": [{"bearer": []}],
        "paths": openapi_jobs.paths(),
    }
    components = doc["components"]["schemas"]
    for part in (openapi_jobs, openapi_queues, openapi_snooze, openapi_effects, openapi_artifacts, openapi_errors):
        components.update(part.SCHEMAS)
    components.update(openapi_schedules.schemas(openapi_queues.SCHEDULE))
    components.update(openapi_logs.SCHEMAS)
    doc["paths"].update(openapi_queues.paths())
    for path, ops in openapi_schedules.paths().items():
        doc["paths"].setdefault(path, {}).update(ops)
    doc["paths"].update(openapi_effects.paths())
    doc["paths"].update(openapi_artifacts.paths())
    doc["paths"].update(openapi_errors.paths())
    doc["paths"].update(openapi_snooze.paths())
    openapi_unique.install(doc)
    openapi_bulk.install(doc)
    openapi_workflows.install(doc)
    components.update(openapi_workers.SCHEMAS)
    doc["paths"].update(openapi_workers.paths())
    doc["paths"].update(openapi_metrics.paths())
    doc["paths"].update(openapi_logs.paths())
    openapi_logs.amend(doc)
    openapi_lists.install(doc)
    openapi_payloads.install(doc, payloads or {})
    scopes.install(doc)
    _common_answers(doc)
    return doc


def _common_answers(doc: dict[str, Any]) -> None:
    """What any operation can answer: an outage (503) or a full disk (507);
    unless public, a missing token (401) and a refusal (403: a scope the
    token lacks, a refused cross-site POST, a viewer's session)."""
    for path, operations in doc["paths"].items():
        if path == "/api/openapi.json":
            continue
        for operation in operations.values():
            operation["responses"].setdefault("503", UNAVAILABLE)
            operation["responses"].setdefault("507", FULL)
            if operation.get("security") != []:
                operation["responses"].setdefault("401", UNAUTHORIZED["401"])
                operation["responses"].setdefault("403", FORBIDDEN)


@bp.get("/openapi.json", endpoint="openapi")
def serve() -> Any:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    specs = [deck.registry.get(name) for name in deck.registry.names()]
    shapes = {s.name: s.payload_shape.schema for s in specs if s is not None and s.payload_shape is not None}
    doc = document(deck.type_names(), shapes)
    if request.script_root:  # mounted under a prefix (jobdeck.embed): the paths are below it
        doc["servers"] = [{"url": request.script_root}]
    return jsonify(doc)
