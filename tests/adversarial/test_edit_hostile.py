"""Hostile input to the edit of a waiting job (``PATCH /api/jobs/{id}`` and
the job page's form): NUL bytes, deep and huge JSON, foreign digits, a
request without the CSRF token or from another site, and a script in the payload. Each is a clear 4xx (JSON
from the API, a visible message in the form) and leaves the job as it was;
the ones that reach the store run on both databases."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from dashboard_support import HTMX
from dashboard_support import post as dash_post
from jobdeck.core.validation import MAX_JSON_DEPTH

pytestmark = pytest.mark.backends


def _patch(client: Any, job_id: int, body: Any, **headers: str) -> Any:
    return client.patch(f"/api/jobs/{job_id}", data=json.dumps(body), content_type="application/json", headers=headers)


def _deep(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"d": value}
    return value


def test_patch_refuses_nul_bytes_deep_json_and_foreign_digits(client, deck, backend) -> None:
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    cases: list[tuple[Any, int, str]] = [
        ({"queue": "mail\x00"}, 422, "queue"),
        ({"payload": {"note": "a\x00b"}}, 200, ""),  # JSON escapes a NUL inside a string: stored and read back
        ({"payload": _deep(MAX_JSON_DEPTH + 5)}, 422, "payload.d.d"),
        ({"priority": "²"}, 422, "priority"),
        ({"priority": "١٢"}, 422, "priority"),
        ({"run_at": "2026-13-45T99:00:00"}, 422, "run_at"),
        ({"run_at": "9999-12-31T23:59:59-05:00"}, 422, "run_at"),
        ([1, 2, 3], 422, "body"),
    ]
    for body, status, field in cases:
        r = _patch(client, job.id, body)
        assert r.status_code == status, (body, r.get_data(as_text=True)[:300])
        if field:
            assert r.get_json()["field"].startswith(field), r.get_json()
    assert deck.store.get(job.id).payload == {"note": "a\x00b"}
    assert deck.store.get(job.id).queue == "default"


def test_patch_refuses_a_huge_or_malformed_body(client, deck, backend) -> None:
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    huge = client.patch(f"/api/jobs/{job.id}", data='{"payload": {"x": "' + "y" * 3_500_000 + '"}}',
                        content_type="application/json")  # fmt: skip
    assert huge.status_code == 413
    assert client.patch(f"/api/jobs/{job.id}", data="{nope", content_type="application/json").status_code == 400
    form = client.patch(f"/api/jobs/{job.id}", data="priority=9", content_type="application/x-www-form-urlencoded")
    assert form.status_code == 415
    assert deck.store.get(job.id) == job


def test_a_cross_site_patch_without_the_token_is_refused(client, deck, backend) -> None:
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "https://evil.example"}):  # fmt: skip
        r = _patch(client, job.id, {"priority": 30}, **headers)
        assert r.status_code == 403 and "cross-origin" in r.get_json()["error"]
    assert deck.store.get(job.id).priority == 0


def test_the_form_refuses_nul_bytes_and_a_missing_csrf_token(dash, deck, backend) -> None:
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    r = dash_post(dash, f"/actions/jobs/{job.id}/edit", {"queue": "a\x00b"})
    assert r.status_code == 422 and "U+0000 at position 2: no control characters" in r.get_data(as_text=True)
    r = dash_post(dash, f"/actions/jobs/{job.id}/edit", {"payload": "[" * 5000 + "]" * 5000})
    assert r.status_code == 422 and "Not an acceptable payload" in r.get_data(as_text=True)
    no_token = dash.post(f"/actions/jobs/{job.id}/edit", data={"priority": "9"}, headers=HTMX)
    assert no_token.status_code == 400  # a stranger's page cannot know the token
    wrong = dash.post(f"/actions/jobs/{job.id}/edit", data={"priority": "9"}, headers={**HTMX, "X-CSRFToken": "x"})
    assert wrong.status_code == 400
    assert deck.store.get(job.id) == job


def test_a_script_in_the_payload_or_queue_is_shown_as_text(dash, deck, backend) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    job, _ = deck.enqueue("demo.noop", {"note": evil}, delay_seconds=60, queue="q<b>")
    html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "<script>alert" not in html and "<img src=x" not in html
    assert 'name="queue" value="q&lt;b&gt;"' in html
    r = dash_post(dash, f"/actions/jobs/{job.id}/edit", {"queue": evil, "priority": evil})
    body = r.get_data(as_text=True)
    assert r.status_code == 422 and "<script>alert" not in body and "&lt;script&gt;" in body
    assert not re.search(r"<img src=x", body)
