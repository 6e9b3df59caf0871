"""The OpenAPI document matches the routes the app really serves."""

from __future__ import annotations

import re

import jsonschema
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
