"""Editing a waiting job through the API (``PATCH /api/jobs/{id}``) and the
job page's form: each answers in place, is audited with the old and new
values, and refuses a job that moved on with 409 and why."""

from __future__ import annotations

import re
from datetime import timedelta

from dashboard_support import make_dash_app, make_dead, post
from jobdeck.core.states import State
from jobdeck.store import Outcome
from jobdeck.store.audit import list_audit
from test_dashboard_auth import USERS, login


def _audit(deck):
    entries, _ = list_audit(deck.store)
    return entries


def _form(html: str) -> dict[str, str]:
    """The edit form's hidden fence fields and inputs, as the browser would post them."""
    fields = dict(re.findall(r'<input type="hidden" name="(seen_\w+)" value="([^"]*)"', html))
    for name in ("priority", "queue", "run_at"):
        match = re.search(rf'name="{name}" value="([^"]*)"', html)
        assert match, name
        fields[name] = match.group(1)
    fields["payload"] = re.search(r'<textarea name="payload"[^>]*>([^<]*)</textarea>', html).group(1)
    return {k: v.replace("&#34;", '"') for k, v in fields.items()}


# -- API ----------------------------------------------------------------------------


def test_patch_edits_a_scheduled_job_and_audits_old_and_new(client, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=3600)
    run_at = deck.clock() + timedelta(hours=2)
    r = client.patch(f"/api/jobs/{job.id}", json={"payload": {"n": 22}, "priority": 20, "queue": "mail",
                                                  "run_at": run_at.isoformat()})  # fmt: skip
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert (body["status"], body["payload"], body["priority"], body["queue"]) == ("pending", {"n": 22}, 20, "mail")
    assert body["scheduled"] is True and body["available_at"].startswith(run_at.isoformat()[:19])
    [entry] = _audit(deck)
    assert (entry.actor, entry.action, entry.job_id, entry.count) == ("api", "edit", job.id, 1)
    assert "priority 0 → 20" in entry.detail and "queue default → mail" in entry.detail
    assert "payload edited (7 → 8 bytes)" in entry.detail and "run at" in entry.detail


def test_patch_on_a_dead_job_edits_and_retries_it(client, deck):
    job_id = make_dead(deck, "demo.flaky", {"failures": 5})
    r = client.patch(f"/api/jobs/{job_id}", json={"payload": {"failures": 0}})
    assert r.status_code == 200 and r.get_json()["status"] == "pending"
    assert deck.store.attempts_of(job_id)[0].payload == {"failures": 5}
    assert _audit(deck)[0].detail.endswith("UTC") and "retried" in _audit(deck)[0].detail


def test_patch_is_409_for_a_running_job_and_for_a_stale_updated_at(client, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    seen = job.updated_at.isoformat()
    [claimed] = deck.store.claim("w1", deck.clock.advance(1), limit=1)
    r = client.patch(f"/api/jobs/{job.id}", json={"priority": 5})
    assert r.status_code == 409
    assert r.get_json() == {
        "error": f"job {job.id} is running; only pending or failed or dead jobs can be edited",
        "job_id": job.id, "status": "running",
    }  # fmt: skip
    deck.store.fail_many([Outcome(job.id, "w1", attempt=claimed.attempt, error="boom")], deck.clock())
    stale = client.patch(f"/api/jobs/{job.id}", json={"priority": 5, "updated_at": seen})
    assert stale.status_code == 409 and "changed since it was shown" in stale.get_json()["error"]
    fresh = deck.store.get(job.id).updated_at.isoformat()
    ok = client.patch(f"/api/jobs/{job.id}", json={"priority": 5, "updated_at": fresh})
    assert ok.status_code == 200 and ok.get_json()["priority"] == 5 and ok.get_json()["status"] == "failed"


BAD = [
    ({}, "body"), ({"updated_at": "2026-01-01T12:00:00Z"}, "body"), ({"colour": "red"}, "colour"),
    ({"priority": "urgent"}, "priority"), ({"queue": "a\u0000b"}, "queue"), ({"run_at": "soon"}, "run_at"),
    ({"payload": "text"}, "payload"), ({"priority": 1, "updated_at": "yesterday"}, "updated_at"),
]  # fmt: skip


def test_patch_refuses_bad_input_with_422_naming_the_field(client, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    for body, field in BAD:
        r = client.patch(f"/api/jobs/{job.id}", json=body)
        assert r.status_code == 422 and r.get_json()["field"] == field, (body, r.get_json())
    assert deck.store.get(job.id) == job


def test_patch_is_404_for_a_missing_job_and_413_for_a_large_payload(client, deck):
    assert client.patch("/api/jobs/424242", json={"priority": 1}).status_code == 404
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    big = client.patch(f"/api/jobs/{job.id}", json={"payload": {"x": "y" * deck.config.max_payload_bytes}})
    assert big.status_code == 413 and deck.store.get(job.id).payload == {"n": 1}


def test_patch_needs_the_token_and_an_operator(deck):
    deck.config.api_token = "sekret"
    app = make_dash_app(deck, users=USERS)
    client = app.test_client()
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    assert client.patch(f"/api/jobs/{job.id}", json={"priority": 3}).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.patch(f"/api/jobs/{job.id}", json={"priority": 3}, headers=wrong).status_code == 401
    login(client, "victor", "victor-secret")
    viewer = client.patch(f"/api/jobs/{job.id}", json={"priority": 3})
    assert viewer.status_code == 403 and "viewer" in viewer.get_json()["error"]
    token = {"Authorization": "Bearer sekret"}
    assert client.patch(f"/api/jobs/{job.id}", json={"priority": 3}, headers=token).status_code == 200
    assert deck.store.get(job.id).priority == 3


# -- the job page -------------------------------------------------------------------


def test_the_job_page_offers_edit_for_waiting_jobs_only(dash, deck):
    scheduled, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    html = dash.get(f"/jobs/{scheduled.id}").get_data(as_text=True)
    assert "Edit this job" in html and "Save changes" in html and 'type="datetime-local"' in html
    assert _form(html)["seen_status"] == "pending" and _form(html)["run_at"] == (
        scheduled.available_at.strftime("%Y-%m-%dT%H:%M:%S")
    )
    dead = make_dead(deck)
    assert "Retry with this payload" in dash.get(f"/jobs/{dead}").get_data(as_text=True)
    running, _ = deck.enqueue("demo.noop", {})
    deck.store.claim("w1", deck.clock(), limit=5)
    assert "edit-form" not in dash.get(f"/jobs/{running.id}").get_data(as_text=True)


def test_editing_a_scheduled_job_from_its_page(dash, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=3600)
    form = _form(dash.get(f"/jobs/{job.id}").get_data(as_text=True))
    later = (deck.clock() + timedelta(hours=3)).replace(microsecond=0)
    form.update(payload='{"n": 2}', priority="high", queue="mail", run_at=later.strftime("%Y-%m-%dT%H:%M"))
    r = post(dash, f"/actions/jobs/{job.id}/edit", form)
    html = r.get_data(as_text=True)
    assert r.status_code == 200, html
    assert '<section id="job-detail"' in html and f"Job {job.id} edited: " in html
    after = deck.store.get(job.id)
    assert (after.status, after.payload, after.priority, after.queue, after.available_at) == (
        State.PENDING, {"n": 2}, 20, "mail", later,
    )  # fmt: skip
    entry = _audit(deck)[0]
    assert (entry.actor, entry.action, entry.count) == ("local operator", "edit", 1)
    assert "priority 0 → 20" in entry.detail


def test_an_unchanged_form_changes_nothing(dash, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=3600, priority=15)
    form = _form(dash.get(f"/jobs/{job.id}").get_data(as_text=True))
    r = post(dash, f"/actions/jobs/{job.id}/edit", form)
    assert r.status_code == 200 and "Nothing changed" in r.get_data(as_text=True)
    assert deck.store.get(job.id) == job and _audit(deck) == []
    r = post(dash, f"/actions/jobs/{job.id}/edit", {**form, "priority": "medium"})  # the label means 10, not 15
    assert r.status_code == 200 and deck.store.get(job.id).priority == 10


def test_an_edit_of_a_job_claimed_meanwhile_is_refused_in_place(dash, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1})
    form = _form(dash.get(f"/jobs/{job.id}").get_data(as_text=True))
    [claimed] = deck.store.claim("w1", deck.clock.advance(1), limit=1)
    form["payload"] = '{"n": 2}'
    r = post(dash, f"/actions/jobs/{job.id}/edit", form)
    html = r.get_data(as_text=True)
    assert r.status_code == 409 and f"Refused: job {job.id} is running" in html and '<section id="job-detail"' in html
    deck.store.fail_many([Outcome(job.id, "w1", attempt=claimed.attempt, error="boom")], deck.clock())
    again = post(dash, f"/actions/jobs/{job.id}/edit", form)
    assert again.status_code == 409 and "changed since it was shown" in again.get_data(as_text=True)
    assert deck.store.get(job.id).payload == {"n": 1}
    assert [e.detail.startswith("refused") for e in _audit(deck)] == [True, True]


def test_bad_input_is_shown_in_the_form_with_what_was_typed(dash, deck):
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    form = _form(dash.get(f"/jobs/{job.id}").get_data(as_text=True))
    for field, value, message in [("priority", "urgent", "unknown priority"), ("queue", "q" * 101, "at most 100"),
                                  ("run_at", "not-a-time", "not an ISO 8601 time"),
                                  ("seen_attempt", "²", "seen_attempt")]:  # fmt: skip
        r = post(dash, f"/actions/jobs/{job.id}/edit", {**form, field: value})
        html = r.get_data(as_text=True)
        assert r.status_code == 422 and message in html, (field, html[-400:])
        assert 'class="field-error"' in html and " open>" in html
        if field != "seen_attempt":
            assert f'name="{field}" value="{value}"' in html
    assert deck.store.get(job.id) == job


def test_a_viewer_sees_no_edit_form_and_cannot_post_one(deck):
    client = make_dash_app(deck, users=USERS).test_client()
    login(client, "victor", "victor-secret")
    job, _ = deck.enqueue("demo.noop", {"n": 1}, delay_seconds=60)
    assert "edit-form" not in client.get(f"/jobs/{job.id}").get_data(as_text=True)
    r = post(client, f"/actions/jobs/{job.id}/edit", {"priority": "9"})
    assert r.status_code == 403 and deck.store.get(job.id).priority == 0
