"""The effects ledger in the dashboard and the API: the job page lists a
job's effects with their state, and a person marks an unknown one done or
not performed (CSRF-checked, operators only, audited), then retries."""

from __future__ import annotations

import pytest
from dashboard_support import make_dash_app, post
from jobdeck.core.errors import EffectOutcomeUnknown
from jobdeck.core.states import EffectState, State
from jobdeck.deck import Jobdeck
from jobdeck.demo import charge_card
from jobdeck.jobs.handlers import JobContext
from jobdeck.store import Outcome
from jobdeck.store.audit import list_audit

KEY = "charge:o-1"


def make_unknown(deck: Jobdeck) -> int:
    """A charge whose attempt 1 died inside the gateway: its attempt 2 found
    the effect started and sent the job to dead, as the worker would."""
    job, _ = deck.enqueue("demo.charge-card", {"order_id": "o-1", "amount_cents": 500}, max_retries=3)
    (first,) = deck.store.claim("w1", deck.clock(), limit=1)
    deck.store.ledger.start(KEY, job.id, first.attempt, "w1", deck.clock())
    stalled = Outcome(job.id, "w1", attempt=first.attempt, error="stalled: worker w1 stopped", kind="stalled")
    deck.store.fail_many([stalled], deck.clock())  # the dead process's attempt, as the sweep records it
    deck.clock.advance(7200)  # type: ignore[attr-defined]  # past the backoff
    (second,) = deck.store.claim("w2", deck.clock(), limit=1)
    ctx = JobContext(deck.store, job.id, second.attempt, "w2", job.type, deck.clock)
    with pytest.raises(EffectOutcomeUnknown) as caught:
        charge_card(job.payload, ctx)
    failed = Outcome(job.id, "w2", attempt=second.attempt, error=str(caught.value), retryable=False)
    deck.store.fail_many([failed], deck.clock())
    assert deck.store.get(job.id).status is State.DEAD
    return job.id


def test_the_job_page_lists_effects_with_their_state(dash, deck):
    job_id = make_unknown(deck)
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "effect charge:o-1 was started by attempt 1 and its outcome is unknown" in html
    assert '<tr class="effect effect-started" data-key="charge:o-1">' in html
    assert "unknown (started)" in html and "Mark done" in html and "Mark not performed" in html


def test_marking_done_then_retrying_completes_without_charging(dash, deck):
    job_id = make_unknown(deck)
    r = post(dash, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "done"})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "Effect charge:o-1 marked done; retry the job to go on." in html
    assert '<section id="job-detail"' in html and "marked by local operator" in html
    assert deck.store.ledger.get(KEY).state is EffectState.DONE
    [entry] = list_audit(deck.store)[0]
    assert (entry.action, entry.job_id, entry.count, entry.detail) == ("effect-done", job_id, 1, f"effect {KEY}")
    # The retry skips the charge the person confirmed.
    deck.store.retry(job_id, deck.clock())
    (job,) = deck.store.claim("w3", deck.clock(), limit=1)
    result = charge_card(job.payload, JobContext(deck.store, job.id, job.attempt, "w3", job.type, deck.clock))
    assert result == {"order_id": "o-1", "charge": None}


def test_marking_not_performed_lets_the_retry_charge(dash, deck):
    job_id = make_unknown(deck)
    r = post(dash, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "not_performed"})
    assert r.status_code == 200 and "marked not performed" in r.get_data(as_text=True)
    deck.store.retry(job_id, deck.clock())
    (job,) = deck.store.claim("w3", deck.clock(), limit=1)
    result = charge_card(job.payload, JobContext(deck.store, job.id, job.attempt, "w3", job.type, deck.clock))
    assert result["charge"]["replayed"] is False
    assert deck.store.ledger.get(KEY).state is EffectState.DONE


def test_resolving_a_known_effect_is_refused_with_409_and_audited(dash, deck):
    job_id = make_unknown(deck)
    assert post(dash, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "done"}).status_code == 200
    r = post(dash, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "not_performed"})
    html = r.get_data(as_text=True)
    assert r.status_code == 409 and "effect &#39;charge:o-1&#39; is done; only started effects" in html
    assert list_audit(deck.store)[0][0].detail.startswith("refused")


@pytest.mark.parametrize(
    ("form", "status", "message"),
    [
        ({"key": KEY, "outcome": "maybe"}, 422, "outcome: must be done or not_performed"),
        ({"key": "charge:nope", "outcome": "done"}, 404, "effect &#39;charge:nope&#39; does not exist"),
        ({"key": "<b>x</b>", "outcome": "done"}, 404, "&lt;b&gt;x&lt;/b&gt;"),
    ],
)
def test_bad_resolves_get_a_clear_message(dash, deck, form, status, message):
    job_id = make_unknown(deck)
    r = post(dash, f"/actions/jobs/{job_id}/effects/resolve", form)
    assert r.status_code == status and message in r.get_data(as_text=True)
    assert deck.store.ledger.get(KEY).state is EffectState.STARTED


def test_another_jobs_effect_cannot_be_resolved_from_this_job(dash, deck):
    job_id = make_unknown(deck)
    other, _ = deck.enqueue("demo.noop")
    r = post(dash, f"/actions/jobs/{other.id}/effects/resolve", {"key": KEY, "outcome": "done"})
    assert r.status_code == 404 and deck.store.ledger.get(KEY).state is EffectState.STARTED
    assert job_id != other.id


def test_resolve_needs_the_csrf_token(dash, deck):
    job_id = make_unknown(deck)
    r = post(dash, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "done"}, token=False)
    assert r.status_code == 400 and deck.store.ledger.get(KEY).state is EffectState.STARTED


def test_a_viewer_sees_effects_but_cannot_mark_them(deck):
    import re

    from tests.helpers import password_hash

    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    job_id = make_unknown(deck)
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    login = client.post("/login", data={"username": "victor", "password": "victor-secret", "csrf_token": token})
    assert login.status_code in (302, 303)
    html = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "unknown (started)" in html and "Mark done" not in html
    r = post(client, f"/actions/jobs/{job_id}/effects/resolve", {"key": KEY, "outcome": "done"})
    assert r.status_code == 403 and deck.store.ledger.get(KEY).state is EffectState.STARTED


# -- the API --------------------------------------------------------------------------


def test_api_lists_and_resolves_effects(client, deck):
    job_id = make_unknown(deck)
    listed = client.get(f"/api/jobs/{job_id}/effects").get_json()
    assert [(e["key"], e["state"], e["attempt"]) for e in listed["effects"]] == [(KEY, "started", 1)]
    r = client.post(f"/api/jobs/{job_id}/effects/{KEY}/resolve", json={"outcome": "done", "result": {"charge_id": 9}})
    assert r.status_code == 200 and r.get_json()["state"] == "done" and r.get_json()["resolved_by"] == "api"
    assert deck.store.ledger.get(KEY).result == {"charge_id": 9}
    again = client.post(f"/api/jobs/{job_id}/effects/{KEY}/resolve", json={"outcome": "done"})
    assert again.status_code == 409 and again.get_json()["state"] == "done"
    assert list_audit(deck.store)[0][-1].action == "effect-done"


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        (KEY, {"outcome": ["done"]}, 422, "outcome"),
        (KEY, {"outcome": "not_performed", "result": 1}, 422, "result"),
        ("x" * 300, {"outcome": "done"}, 422, "key"),
        ("a%00b", {"outcome": "done"}, 422, "key"),
        ("charge:nope", {"outcome": "done"}, 404, None),
    ],
)
def test_api_resolve_rejects_bad_input_clearly(client, deck, path, body, status, field):
    job_id = make_unknown(deck)
    r = client.post(f"/api/jobs/{job_id}/effects/{path}/resolve", json=body)
    assert r.status_code == status and r.get_json()["error"]
    assert r.get_json().get("field") == field
    assert client.get(f"/api/jobs/{job_id + 99}/effects").status_code == 404


@pytest.mark.backends
def test_api_effects_of_an_id_beyond_bigint_is_404(client):
    for url in (f"/api/jobs/{2**63}/effects", f"/api/jobs/{2**64}/effects/k/resolve"):
        r = client.get(url) if url.endswith("effects") else client.post(url, json={"outcome": "done"})
        assert r.status_code == 404 and r.get_json()["error"]


def test_effect_keys_and_results_are_escaped_on_the_job_page(dash, deck):
    job_id = make_unknown(deck)
    nasty = "charge:'\"><script>alert(1)</script>"
    deck.store.ledger.start(nasty, job_id, 2, "w2", deck.clock())
    deck.store.ledger.finish(nasty, job_id, 2, '"<img src=x onerror=alert(2)>"', deck.clock())
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(2)&gt;" in html
