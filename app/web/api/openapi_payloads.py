"""The payload schemas of typed handlers (``jobdeck.jobs.payloads``) in the
OpenAPI document: one component per typed job type, named under
``NewJob.payload``'s ``x-payload-schemas`` by type, so a client generator or a
person reads what an enqueue of that type must carry. ``NewJob.payload``
itself stays any object: a type registered tomorrow is enqueued by a client
generated today."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def component_name(job_type: str) -> str:
    """``Payload.<type>``, within the characters a component name allows."""
    return "Payload." + _UNSAFE.sub("_", job_type)


def install(doc: dict[str, Any], shapes: Mapping[str, Mapping[str, Any]]) -> None:
    """Add ``shapes`` (job type: JSON Schema of its payload) to ``doc``. A
    pydantic model's own models (``$defs``, named by class) go under its
    type's component, ``Payload.<type>.<Model>``, so that a ``Job`` or a
    ``Line`` of its own is never read as the API's or another type's."""
    if not shapes:
        return
    components = doc["components"]["schemas"]
    named: dict[str, Any] = {}
    for job_type in sorted(shapes):
        own = component_name(job_type)
        while own in components:  # "a b" and "a_b" both make Payload.a_b
            own += "_"
        schema = copy.deepcopy(dict(shapes[job_type]))
        defs = schema.pop("$defs", {})
        moved = {_REF + name: f"{_REF}{own}.{_UNSAFE.sub('_', name)}" for name in defs}
        for name, inner in defs.items():
            components[moved[_REF + name][len(_REF) :]] = _moved_refs(inner, moved)
        components[own] = _moved_refs(schema, moved)
        named[job_type] = {"$ref": _REF + own}
    payload = components["NewJob"]["properties"]["payload"]
    payload["x-payload-schemas"] = named
    payload["description"] += "; a typed handler's payload has the schema named by its type in x-payload-schemas"


_REF = "#/components/schemas/"


def _moved_refs(schema: Any, moved: Mapping[str, str]) -> Any:
    """``schema`` with each ``$ref`` to a model of ``moved`` pointing to its new place."""
    if isinstance(schema, dict):
        return {k: moved.get(v, v) if k == "$ref" and isinstance(v, str) else _moved_refs(v, moved)
                for k, v in schema.items()}  # fmt: skip
    if isinstance(schema, list):
        return [_moved_refs(item, moved) for item in schema]
    return schema
