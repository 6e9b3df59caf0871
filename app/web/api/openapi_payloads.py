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
    """Add ``shapes`` (job type: JSON Schema of its payload) to ``doc``."""
    if not shapes:
        return
    components = doc["components"]["schemas"]
    named: dict[str, Any] = {}
    for job_type in sorted(shapes):
        schema = copy.deepcopy(dict(shapes[job_type]))
        for name, inner in schema.pop("$defs", {}).items():  # a pydantic model's own models
            components.setdefault(name, inner)
        components[component_name(job_type)] = schema
        named[job_type] = {"$ref": f"#/components/schemas/{component_name(job_type)}"}
    payload = components["NewJob"]["properties"]["payload"]
    payload["x-payload-schemas"] = named
    payload["description"] += "; a typed handler's payload has the schema named by its type in x-payload-schemas"
