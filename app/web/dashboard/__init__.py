"""The operator dashboard: server-rendered Jinja pages with htmx for live
updates and actions, CSRF on every POST, login and roles when users are
configured.

``init_app(app)`` wires it into the Flask app built by ``create_app``.
Other pages (the schedules page, ...) plug in by registering a blueprint
whose templates extend ``base.html`` and an entry in ``NAV``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, current_app, jsonify, render_template, request
from flask_wtf.csrf import CSRFError, CSRFProtect
from jobdeck.store.overview import Snapshots
from jobdeck.web.dashboard import actions, auth, present, replies, views, workflows
from jobdeck.web.dashboard.settings import load_settings
from jobdeck.web.dashboard.throttle import LoginThrottle

csrf = CSRFProtect()

NAV: list[tuple[str, str, str]] = [
    ("dashboard.overview", "Overview", "overview"),
    ("dashboard.jobs_index", "Jobs", "jobs"),
    ("dashboard.errors_index", "Errors", "errors"),
    ("workflows.index", "Workflows", "workflows"),
    ("workflows.batches", "Batches", "batches"),
    ("schedules.index", "Schedules", "schedules"),
    ("schedules.queues", "Queues", "queues"),
    ("dashboard.workers", "Workers", "workers"),
    ("dashboard.audit", "Audit log", "audit"),
]
"""(endpoint, label, section) in display order. A template marks its link
active with ``{% set section = "schedules" %}``."""


def init_app(app: Flask) -> None:
    deck = app.extensions["jobdeck"]
    settings = load_settings(deck.config)
    app.extensions["jobdeck_dashboard"] = settings
    app.extensions["jobdeck_snapshots"] = Snapshots(deck.store, ttl=settings.counts_cache_seconds)
    app.extensions["jobdeck_nav"] = list(NAV)
    # A dashboard tab stays open for hours: the token lives as long as the session.
    app.config.setdefault("WTF_CSRF_TIME_LIMIT", None)
    app.config.setdefault("WTF_CSRF_HEADERS", ["X-CSRFToken"])
    # Assigned, not setdefault: Flask's defaults already hold these keys
    # (SAMESITE as None), so setdefault left the cookie without SameSite.
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SECURE"] = deck.config.secure_cookies
    app.extensions["jobdeck_login_throttle"] = LoginThrottle(settings.login_failures, settings.login_window_seconds)
    csrf.init_app(app)
    # The API takes no form posts: its bodies are JSON, its state-changing
    # calls without a bearer token are refused cross-site (jobdeck.web.guard).
    for blueprint in app.blueprints.values():
        if (blueprint.url_prefix or "").startswith("/api"):
            csrf.exempt(blueprint)
    app.register_blueprint(auth.bp)
    app.register_blueprint(views.bp)
    app.register_blueprint(actions.bp)
    app.register_blueprint(workflows.bp)
    app.before_request(auth.guard)
    present.register(app)
    app.register_error_handler(CSRFError, _csrf_error)
    app.register_error_handler(404, _not_found)


def _csrf_error(exc: CSRFError) -> Any:
    message = "This form has expired or did not come from this dashboard; reload the page and try again."
    if request.path.startswith("/api/"):
        return current_app.response_class('{"error": "CSRF check failed"}', 400, mimetype="application/json")
    if request.headers.get("HX-Request") == "true":
        return replies.flash_response(message, "error", 400)
    return render_template("error.html", code=400, message=message), 400


def _not_found(exc: Any) -> Any:
    if request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json":
        return jsonify({"error": getattr(exc, "description", None) or "not found"}), 404
    message = getattr(exc, "description", None) or "Not found."
    return render_template("error.html", code=404, message=message), 404
