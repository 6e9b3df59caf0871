"""The scope each API operation needs: one table, read by the guard that
enforces it (``jobdeck.web.guard``) and by the OpenAPI document that states
it (``install``).

Keyed by the operation as Flask routes it, ``"METHOD /rule"``; the value
lists the scopes that grant it, any one of them. An operation missing here
is refused to every named token (403), and tests/test_api_tokens.py, which
walks the URL map, fails until it is added.

- ``enqueue``: add jobs (one, bulk, workflows, batches).
- ``work``: the worker protocol (claim, heartbeat, complete, fail, snooze,
  release, an effect's start, finish and withdraw),
  and reading a job of its own types and queues with its log, artifacts and
  effects (the rows marked ``READ, WORK``).
- ``read``: every other GET, ``/metrics`` too.
- ``operate``: what an operator does: retry, discard, cancel, edit, resolve
  an effect, pause and resume queues and schedules, run, create, edit and
  delete schedules, retry and cancel workflows.
"""

from __future__ import annotations

import re
from typing import Any

from jobdeck.web.tokens import ENQUEUE, OPERATE, READ, WORK

PUBLIC: tuple[str, ...] = ()
"""No token needed: the health check and the document itself."""

OPERATIONS: dict[str, tuple[str, ...]] = {
    "GET /api/health": PUBLIC,
    "GET /api/openapi.json": PUBLIC,
    # producers
    "POST /api/jobs": (ENQUEUE,),
    "POST /api/jobs/bulk": (ENQUEUE,),
    "POST /api/workflows": (ENQUEUE,),
    "POST /api/batches": (ENQUEUE,),
    "POST /api/batches/<int:batch_id>/jobs": (ENQUEUE,),
    "POST /api/batches/<int:batch_id>/close": (ENQUEUE,),
    # workers
    "POST /api/jobs/claim": (WORK,),
    "POST /api/jobs/<int:job_id>/heartbeat": (WORK,),
    "POST /api/jobs/<int:job_id>/complete": (WORK,),
    "POST /api/jobs/<int:job_id>/fail": (WORK,),
    "POST /api/jobs/<int:job_id>/snooze": (WORK,),
    "POST /api/jobs/<int:job_id>/release": (WORK,),
    "POST /api/jobs/<int:job_id>/effects/<path:key>/start": (WORK,),
    "POST /api/jobs/<int:job_id>/effects/<path:key>/finish": (WORK,),
    "POST /api/jobs/<int:job_id>/effects/<path:key>/withdraw": (WORK,),
    "GET /api/jobs/<int:job_id>": (READ, WORK),
    "GET /api/jobs/<int:job_id>/logs": (READ, WORK),
    "GET /api/jobs/<int:job_id>/artifacts": (READ, WORK),
    "GET /api/jobs/<int:job_id>/artifacts/<name>": (READ, WORK),
    "GET /api/jobs/<int:job_id>/effects": (READ, WORK),
    # readers
    "GET /api/jobs": (READ,),
    "GET /api/errors": (READ,),
    "GET /api/stats": (READ,),
    "GET /api/stats/types": (READ,),
    "GET /api/workflows": (READ,),
    "GET /api/workflows/<int:workflow_id>": (READ,),
    "GET /api/batches": (READ,),
    "GET /api/batches/<int:batch_id>": (READ,),
    "GET /api/queues": (READ,),
    "GET /api/schedules": (READ,),
    "GET /api/workers": (READ,),
    "GET /metrics": (READ,),
    # operators
    "PATCH /api/jobs/<int:job_id>": (OPERATE,),
    "POST /api/jobs/<int:job_id>/retry": (OPERATE,),
    "POST /api/jobs/<int:job_id>/discard": (OPERATE,),
    "POST /api/jobs/<int:job_id>/cancel": (OPERATE,),
    "POST /api/jobs/<int:job_id>/effects/<path:key>/resolve": (OPERATE,),
    "POST /api/workflows/<int:workflow_id>/retry": (OPERATE,),
    "POST /api/workflows/<int:workflow_id>/cancel": (OPERATE,),
    "POST /api/queues/<path:name>/pause": (OPERATE,),
    "POST /api/queues/<path:name>/resume": (OPERATE,),
    "POST /api/schedules": (OPERATE,),
    "PUT /api/schedules/<path:name>": (OPERATE,),
    "DELETE /api/schedules/<path:name>": (OPERATE,),
    "POST /api/schedules/<path:name>/run": (OPERATE,),
    "POST /api/schedules/<path:name>/pause": (OPERATE,),
    "POST /api/schedules/<path:name>/resume": (OPERATE,),
}


def key(method: str, rule: str) -> str:
    return f"{method.upper()} {rule}"


def needed(method: str, rule: str | None) -> tuple[str, ...] | None:
    """The scopes that grant this operation (any one), ``PUBLIC`` for
    none needed, None for an operation the table does not know."""
    if rule is None:
        return None
    if method == "HEAD":
        method = "GET"
    return OPERATIONS.get(key(method, rule))


def openapi_path(rule: str) -> str:
    """``/api/jobs/<int:job_id>`` as the document writes it: ``/api/jobs/{job_id}``."""
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def describe(scopes: tuple[str, ...]) -> str:
    """The scope line of an operation's description."""
    if not scopes:
        return "**Scope:** none (no token needed)."
    if scopes == (READ, WORK):
        return "**Scope:** `read`, or `work` for a job of the token's types and queues."
    return "**Scope:** " + " or ".join(f"`{s}`" for s in scopes) + "."


def install(doc: dict[str, Any]) -> None:
    """State each operation's scope in the document: ``x-scopes``, its
    ``security`` (the bearer scheme with the scope as its role, as OpenAPI
    3.1 allows for non-OAuth schemes) and a line of its description."""
    for operation_key, scopes in OPERATIONS.items():
        method, rule = operation_key.split(" ", 1)
        operation = doc["paths"].get(openapi_path(rule), {}).get(method.lower())
        if operation is None:
            continue  # tests/test_openapi.py names a route the document misses
        operation["x-scopes"] = list(scopes)
        if scopes:
            operation["security"] = [{"bearer": [s]} for s in scopes]
        line = describe(scopes)
        description = operation.get("description")
        operation["description"] = f"{description}\n\n{line}" if description else line
