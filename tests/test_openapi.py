"""The OpenAPI document matches the routes the app really serves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.web.api.openapi import document


def _served(app) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/") and rule.rule != "/metrics":  # /metrics: guarded like the API
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            routes.add((path, method.lower()))
    return routes


def test_every_route_is_documented_and_every_documented_path_exists(app) -> None:
    doc = document()
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert _served(app) == documented


def test_document_is_served_and_valid_openapi_31(client) -> None:
    doc = client.get("/api/openapi.json").get_json()
    assert doc["openapi"] == "3.1.0"
    # Every schema in it is itself a valid JSON Schema (2020-12, as 3.1 uses).
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("summary"), f"{method} {path} has no summary"
            assert op["responses"], f"{method} {path} documents no response"
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path


# -- a document that generates clean clients ----------------------------------------------------

OPERATION_ID = re.compile(r"^[a-z][a-zA-Z0-9]*$")
"""camelCase: a generator makes ``enqueue_job`` (Python) or keeps ``enqueueJob`` from it."""


def test_every_served_operation_has_its_own_operation_id_and_a_known_tag(app) -> None:
    """Enumerated from the URL map, so a new route without a name fails here:
    a generated client names each function after ``operationId`` and puts it
    in the module of its first tag (without them, one ``default`` module of
    ``post_api_jobs_job_id_heartbeat``-like names)."""
    doc = document()
    tags = {tag["name"] for tag in doc["tags"]}
    owners: dict[str, list[str]] = {}
    problems = []
    for path, method in sorted(_served(app)):
        op = doc["paths"][path][method]
        name = f"{method.upper()} {path}"
        operation_id = op.get("operationId")
        if not operation_id or not OPERATION_ID.match(operation_id):
            problems.append(f"{name}: operationId {operation_id!r} is not a camelCase name")
        else:
            owners.setdefault(operation_id, []).append(name)
        if not op.get("tags") or not set(op["tags"]) <= tags:
            problems.append(f"{name}: tags {op.get('tags')!r}, not one of the document's {sorted(tags)}")
    problems += [f"operationId {oid!r} is shared by {names}" for oid, names in owners.items() if len(names) > 1]
    assert not problems, "\n".join(problems)
    assert {"enqueueJob", "claimJobs", "heartbeat", "completeJob", "failJob"} <= set(owners)


def _subschemas(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _subschemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _subschemas(value, f"{where}/{i}")


def _shape(schema: Any) -> Any:
    """The schema without its words (descriptions, examples, defaults): two
    schemas of one shape are one model to a generator."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in ("description", "examples", "default")}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def test_no_object_or_enum_schema_is_repeated_instead_of_referenced() -> None:
    """An object or enum written out in two places becomes two models (the
    schedule was five, the job's state four): it must be one component,
    referenced with ``$ref``."""
    doc = document(["demo.noop"])
    seen: dict[str, list[str]] = {}
    for where, node in _subschemas(doc):
        is_object = isinstance(node.get("properties"), dict) and "/properties/properties" not in where
        is_enum = isinstance(node.get("enum"), list) and len(node["enum"]) > 1
        if is_object or is_enum:
            seen.setdefault(json.dumps(_shape(node), sort_keys=True), []).append(where)
    repeated = [places for places in seen.values() if len(places) > 1]
    assert not repeated, "written out more than once; make it a component:\n" + "\n".join(map(str, repeated))
    for where, node in _subschemas(doc):
        ref = node.get("$ref")
        if isinstance(ref, str):
            assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"], (where, ref)


def test_no_const_anywhere() -> None:
    """``const`` is stated as a boolean or an enum instead: openapi-python-client
    0.29 turned ``const: true`` on an optional property into
    ``if duplicate != Trueand ...``, a SyntaxError in the generated client."""
    consts = [where for where, node in _subschemas(document(["demo.noop"])) if "const" in node]
    assert not consts, consts


def test_the_job_type_is_a_string_with_the_accepted_types_as_examples(make_config, registry) -> None:
    """An enum of today's types would make every client refuse a type added
    tomorrow (``ValueError: 'demo.noop' is not a valid NewJobType``)."""
    deck = Jobdeck(make_config(external_types=["ext.resize"]), registry)
    deck.init_db()
    try:
        doc = create_app(deck=deck).test_client().get("/api/openapi.json").get_json()
    finally:
        deck.store.engine.dispose()
    job_type = doc["components"]["schemas"]["NewJob"]["properties"]["type"]
    assert job_type["type"] == "string" and "enum" not in job_type
    assert job_type["examples"] == sorted([*registry.names(), "ext.resize"])
    for name in ("BatchJob", "NewWorkflowJob"):
        assert doc["components"]["schemas"][name]["properties"]["type"] == job_type


def test_every_open_object_says_so() -> None:
    """An object schema without ``properties`` states ``additionalProperties``:
    JSON Schema reads its absence as "anything", but openapi-typescript types
    such a payload ``Record<string, never>``, which no payload satisfies."""
    closed = []
    for where, node in _subschemas(document(["demo.noop"])):
        types = node.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types)
        open_by_omission = "properties" not in node and "additionalProperties" not in node
        if is_object and open_by_omission and "/properties/properties" not in where:
            closed.append(where)
    assert not closed, closed


def test_typed_payloads_nested_models_keep_their_own_schemas(make_config, registry) -> None:
    """A pydantic model's nested models come as ``$defs`` named by class: one
    named like a component of the API (``Job``), or like another type's own
    (two ``Line`` models), must not be read as the other; nor may two types
    whose names differ only in characters a component name cannot hold."""
    pydantic = pytest.importorskip("pydantic")
    line_a = pydantic.create_model("Line", sku=(str, ...))
    line_b = pydantic.create_model("Line", count=(int, ...))
    job = pydantic.create_model("Job", url=(str, ...))
    first = pydantic.create_model("First", line=(line_a, ...), job=(job, ...))
    second = pydantic.create_model("Second", line=(line_b, ...))
    for name, model in (("shop.a", first), ("shop.b", second), ("shop a", second), ("shop_a", first)):
        handler = _typed(model)
        registry.handler(name)(handler)
    deck = Jobdeck(make_config(), registry)
    doc = create_app(deck=deck).test_client().get("/api/openapi.json").get_json()
    components = doc["components"]["schemas"]
    named = components["NewJob"]["properties"]["payload"]["x-payload-schemas"]
    assert "url" not in components["Job"]["properties"], "the API's own Job is untouched"

    def fits(job_type: str, payload: dict[str, Any]) -> bool:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": {"schemas": components},
                  **named[job_type]}  # fmt: skip
        return jsonschema.Draft202012Validator(schema).is_valid(payload)

    assert len({ref["$ref"] for ref in named.values()}) == 4, named
    for job_type in ("shop.a", "shop_a"):
        assert fits(job_type, {"line": {"sku": "x"}, "job": {"url": "u"}}), job_type
        assert not fits(job_type, {"line": {"count": 1}, "job": {"url": "u"}}), job_type
        assert not fits(job_type, {"line": {"sku": "x"}, "job": {"id": 1}}), job_type
    for job_type in ("shop.b", "shop a"):
        assert fits(job_type, {"line": {"count": 1}}) and not fits(job_type, {"line": {"sku": "x"}}), job_type


def _typed(model: Any) -> Any:
    def handle(payload: Any, ctx: Any) -> None:
        return None

    handle.__annotations__["payload"] = model
    return handle
