"""OpenAPI path and schemas of ``GET /api/workers`` (``jobdeck.web.api.workers``),
merged into ``jobdeck.web.api.openapi.document``."""

from __future__ import annotations

from typing import Any

from jobdeck.web.api.openapi_common import TIME, UNAUTHORIZED, answer, ref
from jobdeck.web.api.workers import MAX_CAUSES, MAX_CHILDREN, MAX_GONE, MAX_LIVE, MAX_STOPPED

_COUNT = {"type": "integer", "minimum": 0}
_SLOTS = {"capacity": {**_COUNT, "description": "its slots"}, "busy": {**_COUNT, "description": "slots in use"}}

EXECUTOR = {
    "type": "object",
    "description": "A thread or async executor: its busy slots of its capacity",
    "required": ["capacity", "busy"],
    "properties": {
        **_SLOTS,
        "lag": {
            "type": ["number", "null"],
            "description": "async only: seconds the event loop is late for its tick, to a tenth (0 while it keeps up)",
        },
    },
}
CHILD = {
    "type": "object",
    "required": ["pid", "job_id", "rss_mib", "jobs_run"],
    "properties": {
        "pid": {"type": ["integer", "null"]},
        "job_id": {"type": ["integer", "null"], "description": "the job it runs; null when idle"},
        "rss_mib": {**_COUNT, "description": "its resident memory, MiB"},
        "jobs_run": _COUNT,
    },
}
PROCESS_EXECUTOR = {
    "type": "object",
    "description": "The process executor: its child processes and the children replaced, by cause",
    "required": ["capacity", "busy", "children", "restarts"],
    "properties": {
        **_SLOTS,
        "children": {"type": "array", "maxItems": MAX_CHILDREN, "items": ref("WorkerChild")},
        "restarts": {
            "type": "object",
            "maxProperties": MAX_CAUSES,
            "additionalProperties": _COUNT,
            "description": "children replaced since the pool started, by cause: `timeout`, `memory`, `crash`, "
            "`cancel`, `released`, `recycled`",
        },
    },
}
WORKER_POOL = {
    "type": "object",
    "description": "A worker pool (one per process that runs workers) as its row says",
    "required": [
        "id",
        "host",
        "pid",
        "threads",
        "started_at",
        "heartbeat_at",
        "stopped_at",
        "gone_at",
        "running",
        "abandoned_threads",
        "unhealthy",
        "loop_held",
        "executors",
    ],  # fmt: skip
    "properties": {
        "id": {"type": "string"},
        "host": {"type": "string"},
        "pid": {"type": "integer"},
        "threads": {"type": "integer"},
        "started_at": {"type": "string", "format": "date-time"},
        "heartbeat_at": {"type": "string", "format": "date-time"},
        "stopped_at": TIME,
        "gone_at": {**TIME, "description": "when the sweeper marked it gone (it stopped heart-beating)"},
        "running": {**_COUNT, "description": "jobs it holds running"},
        "abandoned_threads": {**_COUNT, "description": "handler threads abandoned after a timeout, still running"},
        "unhealthy": {"type": ["string", "null"], "description": "why it claims nothing, if so"},
        "loop_held": {
            "type": ["object", "null"],
            "description": "the last time a blocking call held its async handlers' event loop",
            "required": ["seconds", "at", "job_id", "type"],
            "properties": {
                "seconds": {"type": ["number", "null"]},
                "at": TIME,
                "job_id": {"type": ["integer", "null"]},
                "type": {"type": ["string", "null"]},
            },
        },
        "executors": {
            "type": ["object", "null"],
            "description": "what each executor holds, as its monitor last wrote it (every 2 s at most); "
            "null before the first",
            "additionalProperties": False,
            "properties": {
                "thread": ref("WorkerExecutor"),
                "async": ref("WorkerExecutor"),
                "process": ref("WorkerProcessExecutor"),
            },
        },
    },
}
WORKER_LIST = {
    "type": "object",
    "required": ["workers", "gone", "stopped"],
    "properties": {
        "workers": {"type": "array", "maxItems": MAX_LIVE, "items": ref("WorkerPool"), "description": "live pools"},
        "gone": {
            "type": "array",
            "maxItems": MAX_GONE,
            "items": ref("WorkerPool"),
            "description": "pools that stopped heart-beating without stopping, most recently lost first; "
            "their running jobs await rescue",
        },
        "stopped": {
            "type": "array",
            "maxItems": MAX_STOPPED,
            "items": ref("WorkerPool"),
            "description": "newest first",
        },
    },
}
SCHEMAS = {
    "WorkerExecutor": EXECUTOR,
    "WorkerChild": CHILD,
    "WorkerProcessExecutor": PROCESS_EXECUTOR,
    "WorkerPool": WORKER_POOL,
    "WorkerList": WORKER_LIST,
}


def paths() -> dict[str, Any]:
    return {
        "/api/workers": {
            "get": {
                "operationId": "listWorkers",
                "tags": ["process"],
                "summary": "Worker pools: their executors, busy slots, child processes and the async loop's lag",
                "responses": {"200": answer(ref("WorkerList"), "Worker pools"), **UNAUTHORIZED},
            }
        }
    }
