"""A small host Flask app with its own login and routes, with a Jobdeck
mounted at ``/ops/jobs`` (``Jobdeck.init_app``): the embedding tests, the
browser test and the adversarial ones all drive this one.

Its users: ``ada`` is an admin (Jobdeck operator), ``bob`` staff (viewer),
``eve`` a customer (no Jobdeck role at all). Every response the host itself
serves carries ``X-Served-By: host``, so a test can tell which app answered.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Flask, redirect, request, session
from jobdeck.deck import Jobdeck

PREFIX = "/ops/jobs"

HOST_USERS = {
    "ada": ("ada-pw", "operator"),
    "bob": ("bob-pw", "viewer"),
    "eve": ("eve-pw", None),
}
"""name: (password, Jobdeck role)."""

LOGIN_FORM = """<!doctype html><link rel="icon" href="data:,"><title>Host login</title><h1>Host login</h1>
<form method="post"><input name="username" aria-label="User"><input name="password" type="password" aria-label="Password">
<input type="hidden" name="next" value="{next}"><button type="submit">Log in</button></form>"""


def host_user() -> str | None:
    """The host's ``current_user`` (what flask-login would give)."""
    name = session.get("user")
    return name if name in HOST_USERS else None


def host_role() -> str | None:
    name = host_user()
    return HOST_USERS[name][1] if name else None


def make_host(
    deck: Jobdeck, *, login_url: str | None = "/login", current_role: Any = None, current_name: Any = host_user
) -> Flask:
    host = Flask("host_app", static_folder=None)  # not the checkout's static/, found from the cwd
    host.secret_key = "host-secret"
    seen: list[dict[str, Any]] = []
    host.extensions["role_calls"] = seen

    @host.get("/")
    def home() -> Any:
        return f'<!doctype html><link rel="icon" href="data:,"><title>Host home</title><h1>Welcome {host_user() or "guest"}</h1><a href="{PREFIX}/">Jobs</a>'

    @host.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        if request.method == "GET":
            return LOGIN_FORM.format(next=re.sub(r"[^\w/?=&%.-]", "", request.args.get("next", "/")))
        name = request.form.get("username", "")
        if name in HOST_USERS and HOST_USERS[name][0] == request.form.get("password"):
            session["user"] = name
            target = request.form.get("next") or "/"
            return redirect(target if target.startswith("/") and not target.startswith("//") else "/")
        return "wrong password", 401

    @host.post("/logout")
    def logout() -> Any:
        session.clear()
        return redirect("/")

    @host.get("/private")
    def private() -> Any:
        name = host_user()
        return (f"private page of {name}", 200) if name else ("sign in", 401)

    @host.after_request
    def mark(response: Any) -> Any:
        response.headers["X-Served-By"] = "host"
        return response

    def role() -> str | None:
        from flask import current_app

        seen.append({"app": current_app.name, "path": request.path, "user": host_user()})
        return current_role() if current_role is not None else host_role()

    deck.init_app(host, PREFIX, current_role=role, current_name=current_name, login_url=login_url)
    return host


def log_in(client: Any, name: str) -> None:
    response = client.post("/login", data={"username": name, "password": HOST_USERS[name][0]})
    assert response.status_code == 302, response.data


def csrf_of(html: str) -> str:
    """The CSRF token a Jobdeck page carries for htmx (``hx-headers``)."""
    match = re.search(r'&#34;X-CSRFToken&#34;: &#34;([^&]+)&#34;|"X-CSRFToken": "([^"]+)"', html)
    assert match, "no CSRF token on the page"
    return match.group(1) or match.group(2)
