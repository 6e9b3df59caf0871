"""The labels of issue 34 in real Chromium, with a real worker pool: empty
charts say nothing ran; a job that died at once on a non-retryable error
says it was not retried, and why, and why it has no result; the default
priority has the API's word; "First seen" of an error group outlives a
retry-all that fails the same way; Run now on a workflow schedule names the
workflow, a link to it. (Each has a test-client test beside it too:
tests/test_truthful_labels.py, test_error_groups.py, test_workflow_schedules.py.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

WORKFLOWS = {
    "nightly-sales": {
        "jobs": [
            {"name": "extract", "type": "demo.noop", "payload": {"region": "eu"}},
            {"name": "report", "type": "demo.noop", "depends_on": ["extract"]},
        ]
    }
}
SCHEDULES = [{"name": "sales", "cron": "0 3 * * *", "workflow": "nightly-sales"}]


def _enqueue(live, page, body) -> dict:
    r = page.request.post(f"{live.url}/api/jobs", data=body)
    assert r.status == 201, r.text()
    return r.json()


def _until(live, job_id: int, state: State, after: datetime | None = None) -> None:
    def there() -> bool:
        job = live.deck.store.get(job_id)
        return job.status is state and (after is None or job.updated_at > after)

    wait_for(there, timeout=20, message=f"job {job_id} never {state}")


def test_the_labels_tell_the_truth(make_live, page, dialogs):
    live = make_live(workflows=WORKFLOWS, schedules=SCHEDULES)
    page.set_viewport_size({"width": 1280, "height": 800})

    # Nothing has run: both charts say so, neither shows a peak.
    page.goto(live.url + "/")
    expect(page.locator(".chart-peak")).to_have_text(["no runs in the last hour"] * 2)

    # Died at once on a non-retryable error, three retries unused.
    sent = _enqueue(live, page, {"type": "demo.send-email", "payload": {}, "max_retries": 3})
    assert sent["priority_label"] == "low"
    _until(live, sent["id"], State.DEAD)
    page.goto(f"{live.url}/jobs/{sent['id']}")
    expect(page.locator("dd.attempts")).to_have_text("1 of 4, not retried: non-retryable InvalidField")
    expect(page.locator("#job-result")).to_contain_text("No result: died: InvalidField: payload.user_id: required")
    expect(page.locator("dd.priority")).to_have_text("low (0, the default)")  # the API's word
    page.goto(f"{live.url}/jobs/dead")
    expect(page.locator(f"#job-{sent['id']} td.attempts")).to_have_text("1 of 4, not retried")

    # An error group keeps its first time across a retry-all that fails the same way.
    cards = [_enqueue(live, page, {"type": "demo.fail", "payload": {"message": f"card {n} declined"},
                                   "max_retries": 0})["id"] for n in (4242, 1111)]  # fmt: skip
    for job_id in cards:
        _until(live, job_id, State.DEAD)
    died = max(live.deck.store.get(j).updated_at for j in cards)
    page.goto(f"{live.url}/errors/dead")
    group = page.locator("article.error-group", has_text="RuntimeError: card ? declined")
    first_seen = group.locator(".error-group-seen span").first
    expect(first_seen).to_have_attribute("title", re.compile(r"UTC$"))
    first = first_seen.get_attribute("title")
    wait_for(
        lambda: datetime.now(UTC) >= died + timedelta(seconds=1.1), message="the next second"
    )  # times show seconds
    group.get_by_role("button", name="Retry all 2 in this group").click()
    page.get_by_role("button", name="Retry all 2 matching").click()
    expect(page.locator("#confirm")).to_contain_text("2 of 2 retried · done")
    for job_id in cards:
        _until(live, job_id, State.DEAD, after=died)
    page.goto(f"{live.url}/errors/dead")
    expect(first_seen).to_have_attribute("title", first)
    last_seen = group.locator(".error-group-seen span").last
    assert last_seen.get_attribute("title") > first

    # Run now on a workflow schedule names the workflow it started, a link to it.
    page.goto(f"{live.url}/schedules")
    page.locator('tr[data-schedule="sales"]').get_by_role("button", name="Run now").click()
    flash = page.locator(".flash-success > span")
    expect(flash).to_contain_text(re.compile(r"sales: started workflow nightly-sales #\d+$"))
    flash.get_by_role("link").click()
    expect(page.locator("main h1")).to_contain_text("nightly-sales")
    assert re.search(r"/workflows/\d+$", page.url)

    # Jobs ran: the throughput chart has a peak; the latency chart never says nothing ran.
    page.goto(live.url + "/")
    peaks = page.locator(".chart-peak")
    expect(peaks.first).to_have_text(re.compile(r"^peak \d+/min$"))
    expect(peaks.last).to_have_text(re.compile(r"^(peak .+|no job seen waiting)$"))
    assert dialogs == []
