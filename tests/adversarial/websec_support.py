"""Helpers for the web-attack tests: users with real password hashes, and
the login form's CSRF token (the live server is ``live_server.served``)."""

from __future__ import annotations

import re

from werkzeug.security import generate_password_hash

USERS = {
    "alice": {"password_hash": generate_password_hash("alice-secret"), "role": "operator"},
    "victor": {"password_hash": generate_password_hash("victor-secret"), "role": "viewer"},
}


def form_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)
