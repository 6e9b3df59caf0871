"""Operator actions through the test client: each moves jobs through the
store's conditional transitions, is audited, and answers in place; a
refused one says why with 409, never a 500."""

from __future__ import annotations

import json

from dashboard_support import csrf_token, make_dead, post
from jobdeck.core.states import State
from jobdeck.store.audit import list_audit
from jobdeck.store.reads import BATCH


def _audit(deck):
    entries, _ = list_audit(deck.store)
    return entries


def test_retry_from_a_row_swaps_the_row_and_audits(dash, deck):
    job_id = make_dead(deck)
    r = post(dash, f"/actions/jobs/{job_id}/retry", {"from": "row", "tab": "dead"})
    html = r.get_data(as_text=True)
    assert r.status_code == 200
    assert html.lstrip().startswith(f'<tr id="job-{job_id}" class="moved">') and "now pending" in html
    assert f"Job {job_id} retried." in html and 'hx-swap-oob="true"' in html
    assert deck.store.get(job_id).status is State.PENDING
    [entry] = _audit(deck)
    assert (entry.actor, entry.action, entry.job_id, entry.count) == ("local operator", "retry", job_id, 1)


def test_discard_from_the_job_page_rerenders_the_page_part(dash, deck):
    job_id = make_dead(deck)
    r = post(dash, f"/actions/jobs/{job_id}/discard", {"from": "detail"})
    assert r.status_code == 200
    assert '<section id="job-detail"' in r.get_data(as_text=True)
    assert deck.store.get(job_id).status is State.DISCARDED


def test_refused_action_is_409_with_the_reason_and_the_job_as_it_stands(dash, deck):
    job, _ = deck.enqueue("demo.noop", {})
    deck.store.claim("w", deck.clock())
    r = post(dash, f"/actions/jobs/{job.id}/retry", {"from": "row", "tab": "failed"})
    html = r.get_data(as_text=True)
    assert r.status_code == 409
    assert f"job {job.id} is running; only failed or dead or discarded jobs can be retried" in html
    assert f'<tr id="job-{job.id}"' in html
    assert deck.store.get(job.id).status is State.RUNNING
    assert _audit(deck)[0].detail.startswith("refused")


def test_action_on_a_missing_job_is_404_message(dash):
    r = post(dash, "/actions/jobs/12345/discard")
    assert r.status_code == 404 and "job 12345 does not exist" in r.get_data(as_text=True)


def test_without_htmx_an_action_redirects_back_with_a_message(dash, deck):
    job_id = make_dead(deck)
    r = post(dash, f"/actions/jobs/{job_id}/retry", {"next": "/jobs/dead"}, htmx=False)
    assert r.status_code == 303 and r.headers["Location"].endswith("/jobs/dead")
    assert f"Job {job_id} retried." in dash.get("/jobs/dead").get_data(as_text=True)


def test_run_now_makes_a_scheduled_job_due_and_refuses_others(dash, deck):
    job, _ = deck.enqueue("demo.noop", {}, delay_seconds=3600)
    r = post(dash, f"/actions/jobs/{job.id}/run-now", {"from": "row", "tab": "scheduled"})
    assert r.status_code == 200
    assert deck.store.get(job.id).available_at == deck.clock()
    again = post(dash, f"/actions/jobs/{job.id}/run-now", {"from": "row", "tab": "pending"})
    assert again.status_code == 409 and "already due" in again.get_data(as_text=True)
    dead = make_dead(deck)
    refused = post(dash, f"/actions/jobs/{dead}/run-now", {"from": "detail"})
    assert refused.status_code == 409 and "only scheduled or failed jobs can be run now" in refused.get_data(
        as_text=True
    )


def test_edit_and_retry_keeps_the_old_payload_on_the_attempts(dash, deck):
    job_id = make_dead(deck, "demo.flaky", {"failures": 5})
    r = post(dash, f"/actions/jobs/{job_id}/edit", {"payload": '{"failures": 0}'})
    assert r.status_code == 200
    job = deck.store.get(job_id)
    assert job.status is State.PENDING and job.payload == {"failures": 0}
    assert deck.store.attempts_of(job_id)[0].payload == {"failures": 5}
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "Payload this attempt ran with (since edited)" in html
    assert _audit(deck)[0].action == "edit"


def test_edit_and_retry_refuses_bad_json_keeping_the_text(dash, deck):
    job_id = make_dead(deck)
    for text, message in [("{nope", "Not valid JSON"), ("[1, 2]", "must be a JSON object")]:
        r = post(dash, f"/actions/jobs/{job_id}/edit", {"payload": text})
        html = r.get_data(as_text=True)
        assert r.status_code == 422 and message in html
        assert f">{text}</textarea>" in html.replace("&#34;", '"').replace("&#39;", "'")
    assert deck.store.get(job_id).status is State.DEAD


def test_edit_payload_limit(dash, deck):
    job_id = make_dead(deck)
    big = json.dumps({"x": "y" * (deck.config.max_payload_bytes + 1)})
    r = post(dash, f"/actions/jobs/{job_id}/edit", {"payload": big})
    assert r.status_code == 422 and "the limit is" in r.get_data(as_text=True)


def test_bulk_selected_moves_what_it_can_and_says_what_moved_on(dash, deck):
    dead = [make_dead(deck) for _ in range(3)]
    deck.store.retry(dead[2], deck.clock())  # moved on meanwhile: pending now
    r = post(dash, "/actions/selected/retry", {"tab": "dead", "ids": [str(i) for i in dead]})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and r.headers["HX-Trigger"] == "jd-selection-clear"
    assert "2 of 3 selected jobs retried. 1 had moved on" in html
    assert html.lstrip().startswith('<tbody id="job-rows"')
    assert [deck.store.get(i).status for i in dead] == [State.PENDING] * 3
    assert _audit(deck)[0].count == 2


def test_bulk_selected_needs_a_selection(dash):
    r = post(dash, "/actions/selected/discard", {"tab": "dead"})
    assert r.status_code == 422 and "Select some jobs first." in r.get_data(as_text=True)


def test_all_matching_runs_in_batches_and_keeps_to_the_filter(dash, deck):
    deck.enqueue_many([{"type": "demo.noop", "payload": {"n": i}} for i in range(BATCH + 20)])
    keep, _ = deck.enqueue("demo.sleep", {})
    confirm = dash.get("/jobs/pending/confirm/discard?type=demo.noop").get_data(as_text=True)
    assert f"Discard all {BATCH + 20:,} matching" in confirm
    vals = {"tab": "pending", "type": "demo.noop", "up_to": keep.id, "total": BATCH + 20, "done": 0}
    first = post(dash, "/actions/matching/discard", vals)
    html = first.get_data(as_text=True)
    assert f"{BATCH} of {BATCH + 20:,} discarded" in html.replace(",", ",") and 'hx-trigger="load"' in html
    # The fragment carries the next request's values: post them as htmx would.
    import re

    carried = json.loads(re.search(r"hx-vals='([^']+)'", html).group(1).replace("&#34;", '"'))
    second = post(dash, "/actions/matching/discard", carried)
    html = second.get_data(as_text=True)
    assert "done" in html and 'hx-trigger="load"' not in html and second.headers["HX-Trigger"] == "jd-poll"
    counts = deck.store.counts(deck.clock())
    assert counts["discarded"] == BATCH + 20 and deck.store.get(keep.id).status is State.PENDING
    [entry] = _audit(deck)
    assert (entry.action, entry.count) == ("discard all", BATCH + 20) and "type=demo.noop" in entry.detail


def test_all_matching_leaves_jobs_enqueued_after_the_confirmation(dash, deck):
    old = make_dead(deck)
    up_to = old
    newer = make_dead(deck)
    post(dash, "/actions/matching/retry", {"tab": "dead", "up_to": up_to, "total": 1}, htmx=False)
    assert deck.store.get(old).status is State.PENDING and deck.store.get(newer).status is State.DEAD


def test_all_matching_refuses_a_transition_the_tab_does_not_allow(dash, deck):
    r = post(dash, "/actions/matching/retry", {"tab": "running", "up_to": 10})
    assert r.status_code == 409


def test_post_without_csrf_token_is_rejected(dash, deck):
    job_id = make_dead(deck)
    r = post(dash, f"/actions/jobs/{job_id}/retry", token=False)
    assert r.status_code == 400 and "expired" in r.get_data(as_text=True)
    plain = post(dash, f"/actions/jobs/{job_id}/retry", htmx=False, token=False)
    assert plain.status_code == 400
    assert deck.store.get(job_id).status is State.DEAD
    assert _audit(deck) == []


def test_api_stays_csrf_exempt(dash):
    r = dash.post("/api/jobs", json={"type": "demo.noop"})
    assert r.status_code == 201


def test_form_token_works_too(dash, deck):
    job_id = make_dead(deck)
    r = dash.post(f"/actions/jobs/{job_id}/discard", data={"csrf_token": csrf_token(dash)})
    assert r.status_code == 303 and deck.store.get(job_id).status is State.DISCARDED
