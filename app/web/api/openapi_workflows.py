"""OpenAPI paths of workflows and batches (``/api/workflows``, ``/api/batches``),
merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.core.validation import INT64_MAX
from jobdeck.jobs.workflows import MAX_NAME_CHARS, REFUSED_OPTIONS
from jobdeck.store.graph import CALLBACKS, ON_DEPENDENCY_FAILURE
from jobdeck.web.api.openapi_common import (
    ERRORS,
    STATUS,
    TIME,
    UNAUTHORIZED,
    answer,
    new_jobs,
    nullable,
    ref,
    request_body,
    text,
)
from jobdeck.web.api.workflows import MAX_PAGE

_ID = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
_WORKFLOW_ID = {"name": "workflow_id", "in": "path", "required": True, "schema": _ID}
_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": _ID}
_PAGE = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
    {"name": "before", "in": "query", "schema": _ID, "description": "`next_before` of the previous page"},
]
POLICY = {
    "type": "string",
    "enum": list(ON_DEPENDENCY_FAILURE),
    "description": "When a dependency ends dead, cancelled or discarded: cancel the dependents (default), "
    "or hold them blocked until a person retries it",
}
_POLICY = ref("DependencyFailurePolicy")
_COUNTS = {**ref("JobCounts"), "description": "Its jobs by state"}
_NO_WORKFLOW = {"404": answer(ref("Error"), "Unknown workflow")}
_NO_BATCH = {"404": answer(ref("Error"), "Unknown batch")}
_CLOSED = {"409": answer(ref("Error"), "The batch is closed")}
_NAME = text(MAX_NAME_CHARS)

WORKFLOW = {
    "type": "object",
    "required": ["id", "name", "key", "on_dependency_failure", "state", "counts", "total", "done", "created_at"],
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "key": {"type": ["string", "null"]},
        "on_dependency_failure": _POLICY,
        "state": {
            "enum": ["completed", "running", "held", "dead", "cancelled"],
            "description": "From its jobs: held is waiting on a dead job for a person",
        },
        "counts": _COUNTS,
        "total": {"type": "integer"},
        "done": {"type": "integer", "description": "jobs ended: completed, dead, cancelled or discarded"},
        "created_at": TIME,
    },
}
WORKFLOW_JOB = {
    "type": "object",
    "description": "A job as a node of its workflow; its payload, result and error: `GET /api/jobs/{job_id}`",
    "required": ["id", "step", "type", "queue", "priority", "status", "attempt", "deps_left", "available_at"],
    "properties": {
        "id": {"type": "integer"},
        "step": {"type": ["string", "null"]},
        "type": {"type": "string"},
        "queue": {"type": "string"},
        "priority": {"type": "integer"},
        "status": STATUS,
        "scheduled": {"type": "boolean", "description": "pending and not yet due"},
        "attempt": {"type": "integer"},
        "max_retries": {"type": "integer"},
        "deps_left": {"type": ["integer", "null"], "description": "its dependencies not yet completed"},
        "on_dependency_failure": {**nullable("DependencyFailurePolicy"), "description": "its own, if set"},
        "available_at": TIME,
        "claimed_at": TIME,
        "finished_at": TIME,
    },
}
BATCH = {
    "type": "object",
    "required": ["id", "name", "state", "callbacks", "counts", "total", "done", "created_at", "closed_at"],
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["string", "null"]},
        "state": {
            "enum": ["open", "running", "fired"],
            "description": "open: jobs can be added; running: closed; fired: its callbacks were enqueued",
        },
        "callbacks": {
            "type": "object",
            "additionalProperties": True,
            "description": "The callback jobs by name, as checked",
        },
        "counts": _COUNTS,
        "total": {"type": "integer"},
        "done": {"type": "integer"},
        "created_at": TIME,
        "closed_at": TIME,
        "fired_at": TIME,
        "outcome": {
            "type": ["object", "null"],
            "additionalProperties": True,
            "description": "Once fired: the counts it fired on and the callback job ids by name",
        },
    },
}
_NEW_WORKFLOW = {
    "type": "object",
    "required": ["name", "jobs"],
    "additionalProperties": False,
    "properties": {
        "name": _NAME,
        "jobs": {
            "type": "array",
            "minItems": 1,
            "items": ref("NewWorkflowJob"),
            "description": "At most `[workflows] max_jobs`; the dependencies must form no cycle",
        },
        "on_dependency_failure": _POLICY,
        "key": {**text(255), "description": "Enqueue once: a second enqueue with this key answers the first's jobs"},
    },
}
_CALLBACK = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        ref("BatchJob"),
        {"type": "null"},
    ],
    "description": "A job type, or a job (no idempotency_key or unique); enqueued once with `payload.batch`",
}


def _page(key: str, item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": [key, "next_before"],
        "properties": {key: {"type": "array", "items": ref(item)}, "next_before": {"type": ["integer", "null"]}},
    }


SCHEMAS: dict[str, Any] = {
    "DependencyFailurePolicy": POLICY,
    "JobCounts": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "Jobs by state"},
    "Workflow": WORKFLOW,
    "WorkflowJob": WORKFLOW_JOB,
    "WorkflowEdge": {
        "type": "object",
        "required": ["job", "depends_on"],
        "properties": {"job": {"type": "integer"}, "depends_on": {"type": "integer"}},
    },
    "WorkflowDetail": {
        "allOf": [
            ref("Workflow"),
            {
                "type": "object",
                "required": ["jobs", "edges"],
                "properties": {
                    "jobs": {"type": "array", "items": ref("WorkflowJob")},
                    "edges": {"type": "array", "items": ref("WorkflowEdge")},
                },
            },
        ]
    },
    "WorkflowPage": _page("workflows", "Workflow"),
    "WorkflowMoved": {
        "type": "object",
        "required": ["moved", "workflow"],
        "properties": {"moved": {"type": "array", "items": {"type": "integer"}}, "workflow": ref("Workflow")},
    },
    "NewWorkflow": _NEW_WORKFLOW,
    "Batch": BATCH,
    "BatchPage": _page("batches", "Batch"),
    "NewBatch": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"name": {**_NAME, "type": ["string", "null"]}} | {name: _CALLBACK for name in CALLBACKS},
    },
    "NewBatchJobs": new_jobs("BatchJob", "At most `[workflows] max_jobs`"),
    "BatchJobIds": {
        "type": "object",
        "required": ["ids"],
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
    },
}
"""The schemas of these paths; ``install`` adds those derived from ``NewJob``."""


def _action(operation_id: str, summary: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation_id,
            "tags": ["workflows"],
            "summary": summary,
            "parameters": [_WORKFLOW_ID],
            "responses": {
                "200": answer(ref("WorkflowMoved"), "The jobs moved, and the workflow now"),
                **ERRORS,
                **_NO_WORKFLOW,
            },
        }
    }


def paths() -> dict[str, Any]:
    return {
        "/api/workflows": {
            "post": {
                "operationId": "enqueueWorkflow",
                "tags": ["workflows"],
                "summary": "Enqueue a workflow: jobs that wait for other jobs, inserted in one transaction",
                "requestBody": request_body(ref("NewWorkflow")),
                "responses": {
                    "201": answer(ref("EnqueuedWorkflow"), "Created: every job's id by its name"),
                    "200": answer(ref("EnqueuedWorkflow"), "`key` named a workflow enqueued before: its jobs"),
                    "409": answer(ref("Error"), "`key` belongs to a workflow of another name (`workflow_id` names it)"),
                    **ERRORS,
                    "413": answer(ref("Error"), "A payload is over `max_payload_bytes`, or the body over its cap"),
                },
            },
            "get": {
                "operationId": "listWorkflows",
                "tags": ["workflows"],
                "summary": "List workflows, newest first (keyset pagination)",
                "parameters": [*_PAGE, {"name": "name", "in": "query", "schema": text(MAX_NAME_CHARS, 0)}],
                "responses": {
                    "200": answer(ref("WorkflowPage"), "A page of workflows"),
                    **UNAUTHORIZED,
                    "422": ERRORS["422"],
                },
            },
        },
        "/api/workflows/{workflow_id}": {
            "get": {
                "operationId": "getWorkflow",
                "tags": ["workflows"],
                "summary": "A workflow with its jobs and its edges",
                "parameters": [_WORKFLOW_ID],
                "responses": {
                    "200": answer(
                        ref("WorkflowDetail"), "The workflow; its jobs in id order, each a node of the graph"
                    ),
                    **UNAUTHORIZED,
                    **_NO_WORKFLOW,
                },
            }
        },
        "/api/workflows/{workflow_id}/retry": _action(
            "retryWorkflow", "Retry the failed part of a workflow (its failed, dead and discarded jobs); audit-logged"
        ),
        "/api/workflows/{workflow_id}/cancel": _action(
            "cancelWorkflow", "Cancel the rest of a workflow (running jobs cooperatively); audit-logged"
        ),
        "/api/batches": {
            "post": {
                "operationId": "openBatch",
                "tags": ["batches"],
                "summary": "Open a batch: jobs added to it run independently; its callbacks run once all ended",
                "requestBody": request_body(ref("NewBatch"), required=False),
                "responses": {"201": answer(ref("Batch"), "Opened"), **ERRORS},
            },
            "get": {
                "operationId": "listBatches",
                "tags": ["batches"],
                "summary": "List batches, newest first (keyset pagination)",
                "parameters": _PAGE,
                "responses": {
                    "200": answer(ref("BatchPage"), "A page of batches"),
                    **UNAUTHORIZED,
                    "422": ERRORS["422"],
                },
            },
        },
        "/api/batches/{batch_id}": {
            "get": {
                "operationId": "getBatch",
                "tags": ["batches"],
                "summary": "A batch: its state, counts, and once fired, when and its outcome",
                "parameters": [_BATCH_ID],
                "responses": {"200": answer(ref("Batch"), "The batch"), **UNAUTHORIZED, **_NO_BATCH},
            }
        },
        "/api/batches/{batch_id}/jobs": {
            "post": {
                "operationId": "addBatchJobs",
                "tags": ["batches"],
                "summary": "Enqueue jobs into an open batch, in one transaction",
                "parameters": [_BATCH_ID],
                "requestBody": request_body(ref("NewBatchJobs")),
                "responses": {
                    "201": answer(ref("BatchJobIds"), "The new jobs' ids, in the order given"),
                    **ERRORS,
                    **_NO_BATCH,
                    **_CLOSED,
                    "413": answer(ref("Error"), "A payload is over `max_payload_bytes`, or the body over its cap"),
                },
            }
        },
        "/api/batches/{batch_id}/close": {
            "post": {
                "operationId": "closeBatch",
                "tags": ["batches"],
                "summary": "Close a batch: no more jobs; its last job's end fires the callbacks",
                "parameters": [_BATCH_ID],
                "responses": {
                    "200": answer(ref("Batch"), "The batch, closed (fired if all ended)"),
                    **ERRORS,
                    **_NO_BATCH,
                    **_CLOSED,
                },
            }
        },
    }


def install(doc: dict[str, Any]) -> None:
    """The paths, the schemas of the jobs a workflow or batch takes (a
    ``NewJob`` without idempotency_key or unique, so run after
    ``openapi_unique.install``), and the job's workflow fields."""
    doc["paths"].update(paths())
    schemas = doc["components"]["schemas"]
    schemas.update(SCHEMAS)
    new_job = schemas["NewJob"]
    job_fields = {k: v for k, v in new_job["properties"].items() if k not in REFUSED_OPTIONS}
    schemas["BatchJob"] = {**new_job, "properties": job_fields}
    schemas["NewWorkflowJob"] = {
        **new_job,
        "required": ["name", "type"],
        "description": "A job as `POST /api/jobs` takes it (without idempotency_key or unique), named, "
        "with the names of the jobs it waits for",
        "properties": {
            "name": {**_NAME, "description": "Unique within the workflow"},
            **job_fields,
            "depends_on": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "on_dependency_failure": _POLICY,
        },
    }
    schemas["EnqueuedWorkflow"] = {
        "type": "object",
        "required": ["id", "name", "jobs", "created"],
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "jobs": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "name -> job id"},
            "created": {"type": "boolean"},
        },
    }
    job = schemas["Job"]["properties"]
    job["workflow_id"] = {"type": ["integer", "null"], "description": "The workflow it is a job of, if any"}
    job["batch_id"] = {"type": ["integer", "null"], "description": "The batch it belongs to, if any"}
    job["step"] = {"type": ["string", "null"], "description": "Its name within its workflow"}
