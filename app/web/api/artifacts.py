"""A job's artifacts over HTTP (``ctx.artifact``; ``jobdeck.jobs.artifacts``).

    GET /api/jobs/<id>/artifacts          -> {"artifacts": [Artifact]}
    GET /api/jobs/<id>/artifacts/<name>   -> the file's bytes

Same bearer token as the rest of ``/api`` (or a signed-in dashboard
session; viewers may download). ``download`` builds the file response for
this API and for the dashboard's own download route: an artifact is user
data served from the dashboard's origin, so anything that a browser could
render as a page (HTML, SVG, ...) is sent as an attachment, never inline,
under a sandboxing Content-Security-Policy and ``nosniff``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from flask import Blueprint, Response, current_app, jsonify
from jobdeck.deck import Jobdeck
from jobdeck.jobs.artifacts import check_name
from jobdeck.store.artifacts import Artifact, artifacts_of, get_artifact
from jobdeck.web.api import jobs as api
from jobdeck.web.serialize import artifact_json

bp = Blueprint("api_artifacts", __name__, url_prefix="/api/jobs")
bp.before_request(api._authenticate)

INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "text/plain"})
"""Media types a browser shows without running anything (no SVG: it can
hold script). Every other type downloads."""
SANDBOX = "sandbox; default-src 'none'; frame-ancestors 'none'"
"""Should a browser render a download anyway, nothing in it runs or loads."""


def _deck() -> Jobdeck:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    return deck


@bp.get("/<int:job_id>/artifacts")
def list_artifacts(job_id: int) -> Any:
    deck = _deck()
    deck.store.get(job_id)  # 404 for an unknown job
    return jsonify({"artifacts": [artifact_json(a) for a in artifacts_of(deck.store, job_id)]})


@bp.get("/<int:job_id>/artifacts/<name>")
def download_artifact(job_id: int, name: str) -> Any:
    deck = _deck()
    check_name(name)  # 422 before the database sees a NUL
    deck.store.get(job_id)
    return download(get_artifact(deck.store, job_id, name))


def download(artifact: Artifact) -> Response:
    """The artifact's bytes with its content type, as an attachment unless
    the type is in ``INLINE_TYPES``, named by RFC 6266 / RFC 5987."""
    info = artifact.info
    media_type = info.content_type.split(";", 1)[0].strip().lower()
    disposition = "inline" if media_type in INLINE_TYPES else "attachment"
    response = Response(artifact.data, status=200, content_type=info.content_type)
    response.headers["Content-Disposition"] = content_disposition(disposition, info.name)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = SANDBOX
    response.headers["Cache-Control"] = "private, no-store"
    return response


def content_disposition(disposition: str, name: str) -> str:
    """``attachment; filename="ascii fallback"; filename*=UTF-8''percent-encoded``:
    the fallback keeps printable ASCII but quotes and backslashes (``_``
    instead), the extended form carries the exact name; neither can hold a
    character that ends the header."""
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in name)
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
