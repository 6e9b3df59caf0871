""" "Why is it waiting?" over HTTP: ``waiting_reason`` in the API's job JSON,
the muted line in the list rows and on the job page, escaped, and read once
per request however many rows are shown."""

from __future__ import annotations

import html

from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.store import Outcome

from tests.dashboard_support import HTMX
from tests.helpers import force_state, statements_sent
from tests.openapi_check import check

PAUSED_LINE = "Waiting: Queue reports is paused"


def test_the_api_says_why_a_job_waits_and_null_otherwise(deck, clock):
    client = create_app(deck=deck).test_client()
    report, _ = deck.enqueue("demo.report")
    assert client.post("/api/queues/reports/pause").status_code == 200
    body = check(client.get(f"/api/jobs/{report.id}"), "/api/jobs/{job_id}", "get")
    assert body["waiting_reason"] == {"code": "queue_paused", "message": "Queue reports is paused", "queue": "reports"}
    listed = check(client.get("/api/jobs?status=pending"), "/api/jobs", "get")["jobs"]
    assert [j["waiting_reason"]["code"] for j in listed] == ["queue_paused"]
    client.post("/api/queues/reports/resume")
    # No worker pool in this test: resumed, it waits for a worker.
    assert client.get(f"/api/jobs/{report.id}").get_json()["waiting_reason"]["code"] == "no_worker"
    deck.store.register_worker("pool-1", "host", 1, 2, clock.now)
    assert client.get(f"/api/jobs/{report.id}").get_json()["waiting_reason"] is None
    force_state(deck, report.id, State.RUNNING, worker_id="pool-1")
    assert client.get(f"/api/jobs/{report.id}").get_json()["waiting_reason"] is None


def test_the_enqueue_answer_says_a_paused_queue_holds_the_new_job(deck):
    client = create_app(deck=deck).test_client()
    client.post("/api/queues/reports/pause")
    r = client.post("/api/jobs", json={"type": "demo.report"})
    assert check(r, "/api/jobs", "post")["waiting_reason"]["code"] == "queue_paused"


def test_job_json_outside_a_request_has_no_waiting_reason(deck):
    from jobdeck.web.serialize import job_json

    job, _ = deck.enqueue("demo.report")
    assert "waiting_reason" not in job_json(job, deck.clock())


def test_the_row_and_the_job_page_show_the_reason(deck, dash):
    report, _ = deck.enqueue("demo.report")
    noop, _ = deck.enqueue("demo.noop")
    deck.queues.set_paused("reports", True, deck.clock(), "test")
    page = dash.get("/jobs/pending").get_data(as_text=True)
    row = page[page.index(f'id="job-{report.id}"') :]
    assert PAUSED_LINE in row[: row.index("</tr>")]
    other = page[page.index(f'id="job-{noop.id}"') :]
    assert 'data-waiting="no_worker"' in other[: other.index("</tr>")]
    rows = dash.get("/fragments/jobs/pending/rows", headers=HTMX).get_data(as_text=True)
    assert PAUSED_LINE in rows
    detail = dash.get(f"/jobs/{report.id}").get_data(as_text=True)
    assert PAUSED_LINE in detail
    live = dash.get(f"/fragments/jobs/{report.id}", headers=HTMX).get_data(as_text=True)
    assert PAUSED_LINE in live
    deck.queues.set_paused("reports", False, deck.clock(), "test")
    assert "queue_paused" not in dash.get(f"/jobs/{report.id}").get_data(as_text=True)


def test_finished_jobs_show_no_reason(deck, dash):
    job, _ = deck.enqueue("demo.report")
    deck.queues.set_paused("reports", True, deck.clock(), "test")
    force_state(deck, job.id, State.COMPLETED, worker_id=None)
    assert "Waiting:" not in dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "Waiting:" not in dash.get("/jobs/completed").get_data(as_text=True)


def test_a_hostile_queue_name_is_escaped_in_the_reason(deck, dash):
    name = '<img src=x onerror="alert(1)">'
    job, _ = deck.enqueue("demo.noop", queue=name)
    deck.queues.set_paused(name, True, deck.clock(), "test")
    for url in ("/jobs/pending", f"/jobs/{job.id}"):
        body = dash.get(url).get_data(as_text=True)
        assert "<img src=x" not in body
        assert html.escape(f"Waiting: Queue {name} is paused", quote=False) in body.replace("&#34;", '"')


def test_a_list_page_reads_the_reasons_once_not_per_row(deck, dash):
    deck.queues.set_paused("reports", True, deck.clock(), "test")
    deck.enqueue("demo.report")
    assert _reads_of_workers(deck, dash) == 1
    for _ in range(30):
        deck.enqueue("demo.report")
    assert _reads_of_workers(deck, dash) == 1


def _reads_of_workers(deck, dash) -> int:
    """How often one render of the pending list reads the workers table
    (the reasons' read, at driver level; nothing else on the page reads it)."""
    with statements_sent(deck) as sent:
        assert PAUSED_LINE in dash.get("/jobs/pending").get_data(as_text=True)
    return sum(1 for statement in sent if "FROM workers" in statement)


def test_a_failed_job_in_backoff_says_when_it_retries(deck, dash):
    job, _ = deck.enqueue("demo.fail", max_retries=2)
    now = deck.clock()
    assert [j.id for j in deck.store.claim("w1", now, limit=1)] == [job.id]
    deck.store.fail_many([Outcome(job.id, "w1", error="boom")], now)
    failed = deck.store.get(job.id)
    assert failed.status is State.FAILED and failed.available_at > now
    at = failed.available_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    page = dash.get("/jobs/failed").get_data(as_text=True)
    row = page[page.index(f'id="job-{job.id}"') :]
    assert f"Waiting: Retrying at {at}" in row[: row.index("</tr>")]
    api = create_app(deck=deck).test_client().get(f"/api/jobs/{job.id}").get_json()
    assert api["waiting_reason"]["code"] == "retry_backoff"
