"""Cancel from the API and the dashboard: operators only, audit-logged,
200 for a job cancelled at once, 202 for a running one asked to stop, 409
with the reason when refused; every answer checked against the OpenAPI
document; hostile requests refused."""

from __future__ import annotations

import re

from dashboard_support import make_dash_app, post
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.audit import list_audit

from tests.helpers import password_hash
from tests.openapi_check import check

CANCEL = "/api/jobs/{job_id}/cancel"


def _url(job_id: int) -> str:
    return CANCEL.format(job_id=job_id)


def _running(deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop")
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1)
    assert claimed.id == job.id
    return job.id


def test_api_cancels_a_pending_job_with_200_and_audits_it(client, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    r = client.post(_url(job.id), json={})
    body = check(r, CANCEL, "post")
    assert r.status_code == 200 and body["status"] == "cancelled" and body["finished_at"]
    (entry,), _ = list_audit(deck.store)
    assert (entry.actor, entry.action, entry.job_id, entry.count) == ("api", "cancel", job.id, 1)


def test_api_answers_202_for_a_running_job_asked_to_stop(client, deck) -> None:
    job_id = _running(deck)
    r = client.post(_url(job_id))
    body = check(r, CANCEL, "post")
    assert r.status_code == 202 and body["status"] == "running" and body["cancel_requested"] is True
    assert body["cancel_requested_at"]
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "w1"})
    assert check(r, "/api/jobs/{job_id}/heartbeat", "post")["cancel"] is True
    r = client.post(f"/api/jobs/{job_id}/complete", json={"worker_id": "w1", "result": {"done": 1}})
    assert r.status_code == 200 and r.get_json()["status"] == "cancelled"


def test_api_refuses_a_dead_or_finished_job_with_409_and_logs_the_refusal(client, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    deck.cancel(job.id, actor="first")
    r = client.post(_url(job.id))
    body = check(r, CANCEL, "post")
    assert r.status_code == 409 and body["status"] == "cancelled" and body["job_id"] == job.id
    assert (
        body["error"]
        == f"job {job.id} is cancelled; only pending or running or failed or blocked jobs can be cancelled"
    )
    entries, _ = list_audit(deck.store)
    assert [(e.actor, e.count) for e in entries] == [("api", 0), ("first", 1)]
    assert entries[0].detail and entries[0].detail.startswith("refused: ")


def test_api_cancel_of_a_missing_job_is_404(client) -> None:
    r = client.post(_url(999999))
    assert r.status_code == 404 and check(r, CANCEL, "post")["error"] == "job 999999 does not exist"


def test_api_cancel_needs_the_token(make_deck, clock) -> None:
    deck = make_deck(clock, api_token="s3cret")
    job, _ = deck.enqueue("demo.noop")
    client = create_app(deck=deck).test_client()
    r = client.post(_url(job.id))
    assert r.status_code == 401 and check(r, CANCEL, "post")["error"] == "missing or invalid bearer token"
    assert client.post(_url(job.id), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert deck.store.get(job.id).status is State.PENDING
    ok = client.post(_url(job.id), headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and deck.store.get(job.id).status is State.CANCELLED


def _signed_in(deck: Jobdeck, role: str):
    users = {"ann": {"password_hash": password_hash("ann-secret-1"), "role": role}}
    client = make_dash_app(deck, users=users).test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    login = client.post("/login", data={"username": "ann", "password": "ann-secret-1", "csrf_token": token})
    assert login.status_code in (302, 303)
    return client


def test_a_viewer_can_cancel_neither_in_the_dashboard_nor_the_api(deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    client = _signed_in(deck, "viewer")
    assert "Cancel…" not in client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert post(client, f"/actions/jobs/{job.id}/cancel", {"from": "detail"}).status_code == 403
    r = client.post(_url(job.id), json={})
    assert r.status_code == 403 and "only operators can act" in check(r, CANCEL, "post")["error"]
    assert deck.store.get(job.id).status is State.PENDING
    assert list_audit(deck.store)[0] == []


def test_an_operator_cancels_from_the_job_page_audited_by_name(deck) -> None:
    job_id = _running(deck)
    client = _signed_in(deck, "operator")
    page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "Cancel…" in page and "Its handler is asked to stop" in page
    r = post(client, f"/actions/jobs/{job_id}/cancel", {"from": "detail"})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "Cancelling…" in html and "Cancel…" not in html
    assert "is asked to stop" in r.headers.get("HX-Trigger", "") + html
    assert deck.store.get(job_id).status is State.RUNNING
    (entry,), _ = list_audit(deck.store)
    assert (entry.actor, entry.action, entry.count) == ("ann", "cancel", 1)
    deck.store.complete(job_id, "w1", deck.clock())
    page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "badge-cancelled" in page and "Cancel…" not in page


def test_the_dashboard_refuses_a_finished_job_with_409(deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    deck.cancel(job.id, actor="x")
    client = make_dash_app(deck).test_client()
    r = post(client, f"/actions/jobs/{job.id}/cancel", {"from": "row", "tab": "cancelled"})
    assert r.status_code == 409 and "only pending or running or failed or blocked jobs can be cancelled" in r.get_data(
        as_text=True
    ) + r.headers.get("HX-Trigger", "")


def test_the_cancelled_tab_lists_cancelled_jobs(deck) -> None:
    job, _ = deck.enqueue("demo.noop", {"note": "<script>alert(1)</script>"})
    deck.cancel(job.id, actor="x")
    client = make_dash_app(deck).test_client()
    html = client.get("/jobs/cancelled").get_data(as_text=True)
    assert f'id="job-{job.id}"' in html and "<script>alert(1)</script>" not in html
    assert "Cancelled" in client.get("/jobs/pending").get_data(as_text=True)


# -- hostile requests -----------------------------------------------------------------


def test_a_dashboard_cancel_without_csrf_is_refused(deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    client = make_dash_app(deck).test_client()
    r = post(client, f"/actions/jobs/{job.id}/cancel", {"from": "detail"}, token=False)
    assert r.status_code == 400 and deck.store.get(job.id).status is State.PENDING


def test_a_cross_site_api_cancel_is_refused(client, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        r = client.post(_url(job.id), json={}, headers=headers)
        assert r.status_code == 403, headers
    r = client.post(_url(job.id), data="{}", content_type="text/plain")
    assert r.status_code == 415
    assert deck.store.get(job.id).status is State.PENDING


def test_hostile_bodies_and_ids_are_4xx_not_500(client, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    deep = "[" * 5000 + "]" * 5000
    for data in ('{"x": "\\u0000"}' + "x", deep, '{"a": NaN}', "[1, 2]"):
        r = client.post(_url(job.id), data=data, content_type="application/json")
        assert 400 <= r.status_code < 500, (data[:20], r.status_code)
    assert client.post("/api/jobs/99999999999999999999/cancel").status_code == 404
    assert client.post("/api/jobs/-1/cancel").status_code == 404
    assert deck.store.get(job.id).status is State.PENDING
