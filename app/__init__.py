"""Jobdeck: a background job queue with an operator dashboard.

``create_app`` builds the Flask app and starts nothing; ``app.runtime.Runtime``
starts the worker pool and the scheduler, once per process.
"""

from __future__ import annotations

import secrets
from typing import Any

from flask import Flask, jsonify, request
from htmx_flask import Htmx
from werkzeug.exceptions import HTTPException

from app.config import Config, load
from app.errors import JobdeckError
from app.handlers import Registry, import_modules
from app.handlers import registry as default_registry
from app.service import Jobdeck

__all__ = ["create_app", "deck_of"]


def create_app(
    config: Config | None = None,
    *,
    deck: Jobdeck | None = None,
    registry: Registry | None = None,
    init_db: bool = True,
) -> Flask:
    if deck is None:
        config = config or load()
        registry = registry if registry is not None else default_registry
        import_modules(config.handler_modules)
        if config.demo:
            from app import demo

            demo.register(registry, config.instance_path)
        deck = Jobdeck(config, registry)
    config = deck.config
    from app.wiring import install

    install(deck)  # schedules, queue controls, alerts: a bad entry stops start-up here
    if init_db:
        deck.init_db()

    app = Flask(__name__, template_folder="../templates", static_folder="../static")
    app.config["SECRET_KEY"] = config.secret_key or secrets.token_hex(32)
    # The payload limit applies to the payload; the rest of a body is small.
    app.config["MAX_CONTENT_LENGTH"] = config.max_payload_bytes + 16 * 1024
    app.extensions["jobdeck"] = deck
    Htmx(app)

    from app import api

    app.register_blueprint(api.bp)
    from app import api_queues, schedules_views

    app.register_blueprint(api_queues.bp)
    app.register_blueprint(schedules_views.bp)
    app.register_blueprint(schedules_views.api_bp)

    from app import dashboard

    dashboard.init_app(app)
    _register_errors(app)
    app.after_request(_security_headers)
    if config.secure_cookies:
        app.after_request(_strict_transport)
    return app


def deck_of(app: Flask) -> Jobdeck:
    deck: Jobdeck = app.extensions["jobdeck"]
    return deck


def _register_errors(app: Flask) -> None:
    @app.errorhandler(JobdeckError)
    def _jobdeck_error(exc: JobdeckError) -> Any:
        return jsonify(exc.to_dict()), exc.status_code

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Any:
        if request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json":
            message = exc.description or exc.name
            if exc.code == 413:
                message = "request body too large"
            return jsonify({"error": message}), exc.code
        return exc


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
