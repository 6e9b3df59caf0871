"""Validate real API responses against the OpenAPI document's schemas."""

from __future__ import annotations

from typing import Any

import jsonschema
from jobdeck.web.api.openapi import document

DOC = document()


def check(response: Any, path: str, method: str) -> Any:
    """Assert ``response`` is documented for (path, method, status) and its
    body validates against the documented schema; returns the JSON body."""
    op = DOC["paths"][path][method.lower()]
    status = str(response.status_code)
    assert status in op["responses"], f"{method} {path} answered {status}, which is not documented"
    body = response.get_json()
    schema = op["responses"][status]["content"]["application/json"]["schema"]
    wrapper = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": DOC["components"], **schema}
    jsonschema.validate(body, wrapper, cls=jsonschema.Draft202012Validator)
    return body
