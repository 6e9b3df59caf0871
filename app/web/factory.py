"""The application factory: ``create_app`` builds the Flask app (API,
dashboard, error answers, security headers) around a deck and starts
nothing; ``jobdeck.runtime.Runtime`` starts the worker pool and the scheduler,
once per process. Imported as ``app.create_app``."""

from __future__ import annotations

import logging
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, render_template, request
from htmx_flask import Htmx
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket
from jobdeck.core.config import Config, load
from jobdeck.core.errors import JobdeckError
from jobdeck.core.validation import fits_id
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.web import api_requests
from jobdeck.web.body_limits import body_cap, too_large
from jobdeck.web.converters import IdConverter, NamePathConverter
from jobdeck.web.tokens import load_tokens
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException, NotFound

log = logging.getLogger("jobdeck.web")
_PACKAGE = Path(__file__).resolve().parents[1]


def create_app(
    config: Config | None = None,
    *,
    deck: Jobdeck | None = None,
    registry: Registry | None = None,
    init_db: bool = True,
) -> Flask:
    if deck is None:
        deck = Jobdeck.of(config or load(), registry, init_db=init_db)
    elif init_db:
        deck.init_db()
    config = deck.config  # the deck checked its schedules, queues, alerts and retention when built

    # A wheel carries templates/ and static/ inside the package; a checkout keeps them beside it.
    assets = _PACKAGE if (_PACKAGE / "templates").is_dir() else _PACKAGE.parent
    app = Flask("jobdeck", template_folder=assets / "templates", static_folder=assets / "static")
    app.jinja_options = {**app.jinja_options, "bytecode_cache": _COMPILED_TEMPLATES}
    app.url_map.converters["int"] = IdConverter  # before any route: ids beyond BIGINT match none
    app.url_map.converters["path"] = NamePathConverter  # names with a line break reach their views
    app.config["SECRET_KEY"] = config.secret_key or secrets.token_hex(32)
    app.config["MAX_CONTENT_LENGTH"] = body_cap(config)
    app.extensions["jobdeck"] = deck
    app.extensions["jobdeck_tokens"] = load_tokens(config)
    app.wsgi_app = _under_request_timeouts(app.wsgi_app, deck)  # type: ignore[method-assign]
    Htmx(app)

    from jobdeck.web.api import artifacts, effects, errors, jobs, logs, queues
    from jobdeck.web.dashboard import artifacts as dashboard_artifacts
    from jobdeck.web.dashboard import logs as dashboard_logs
    from jobdeck.web.dashboard import schedule_edit, schedules

    for blueprint in (jobs.bp, effects.bp, queues.bp, schedules.bp, schedules.api_bp, schedule_edit.bp,
                      schedule_edit.api_bp, artifacts.bp, errors.bp, logs.bp):  # fmt: skip
        app.register_blueprint(blueprint)
    app.register_blueprint(dashboard_artifacts.bp)
    from jobdeck.web import metrics

    app.register_blueprint(metrics.bp)
    app.register_blueprint(dashboard_logs.bp)

    from jobdeck.web import dashboard

    dashboard.init_app(app)
    _register_errors(app)
    api_requests.install(app)
    app.after_request(_security_headers)
    if config.secure_cookies:
        app.after_request(_strict_transport)
    return app


class _CompiledTemplates(BytecodeCache):
    """Each template compiled once per process, not once per app. Every app
    this factory builds has its own Jinja environment, made with the same
    options; compiling a page's templates costs tens of milliseconds, paid
    again by each app (a host embedding several, the test suite's one per
    test). Jinja checks each entry against its template's source before
    using it, so an edited template is compiled afresh."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_COMPILED_TEMPLATES = _CompiledTemplates()


def _under_request_timeouts(wsgi_app: Any, deck: Jobdeck) -> Any:
    """Every statement a request makes runs under the request timeouts
    (PostgreSQL: ``request_lock_timeout``, ``request_statement_timeout``)."""

    def serve(environ: Any, start_response: Any) -> Any:
        with deck.store.serving_request():
            return wsgi_app(environ, start_response)

    return serve


def deck_of(app: Flask) -> Jobdeck:
    deck: Jobdeck = app.extensions["jobdeck"]
    return deck


def _names_no_row(path: str) -> bool:
    """Whether the path holds a number too large to be any row's id."""
    return any(
        part.isascii() and part.isdigit() and (len(part) > 19 or not fits_id(int(part))) for part in path.split("/")
    )


def _register_errors(app: Flask) -> None:
    @app.errorhandler(JobdeckError)
    def _jobdeck_error(exc: JobdeckError) -> Any:
        if _wants_json():
            return jsonify(exc.to_dict()), exc.status_code
        from jobdeck.web.dashboard.replies import error_response

        return error_response(str(exc), exc.status_code)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Any:
        if exc.code == 405 and _names_no_row(request.path):
            # Werkzeug checks a rule's methods before its converters, so an id
            # beyond BIGINT (which no <int:...> accepts) reached "method not
            # allowed" through another method's rule of the same path.
            exc = NotFound()
        if _wants_json():
            message = exc.description or exc.name
            if exc.code == 413:  # the limit follows max_payload_bytes (a workflow of many jobs meets it first)
                message = too_large(request.max_content_length or 0, request.path)
            return jsonify({"error": message}), exc.code
        return exc

    def _database_error(exc: Exception) -> Any:
        """An outage (connection lost or refused, database locked, disk
        full, read-only storage, no memory or connection slots left) is the
        client's to retry: 503, or 507 for a full disk, with ``Retry-After``
        and the cause, never 500. Any other database error is a bug and
        stays a 500, with its traceback logged."""
        store = deck_of(app).store
        outage = store.storage.outage_of(exc)
        if outage is None:
            raise exc
        store.storage.failed(outage)
        driver_error = getattr(exc, "orig", None) or exc
        log.warning("%s %s: %s (%s: %s)", request.method, request.path, outage.message,
                    driver_error.__class__.__name__, driver_error)  # fmt: skip
        if _wants_json():
            response = jsonify({"error": outage.message, "cause": outage.cause})
            response.status_code = outage.status
        elif request.headers.get("HX-Request"):
            from jobdeck.web.dashboard.replies import error_response

            response = error_response(outage.message, outage.status)
        else:
            page = render_template("error.html", code=outage.status, message=outage.message)
            response = app.make_response((page, outage.status))
        response.headers["Retry-After"] = str(outage.retry_after)
        return response

    # DisconnectionError and InvalidRequestError: the pool found no live connection to hand out (faults.py).
    for kind in (sa_exc.DBAPIError, sa_exc.TimeoutError, sa_exc.DisconnectionError, sa_exc.InvalidRequestError,
                 sqlite3.Error):  # fmt: skip
        app.register_error_handler(kind, _database_error)


def _wants_json() -> bool:
    """The API, or a client that asked for JSON, is answered in JSON; the
    dashboard's pages and fragments in HTML."""
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def _strict_transport(response: Any) -> Any:
    """With ``secure_cookies`` the deployment is served over HTTPS: tell the
    browser to refuse plain HTTP here for a year (a downgrade would expose
    the session cookie's requests)."""
    response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


def _security_headers(response: Any) -> Any:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    )
    return response
