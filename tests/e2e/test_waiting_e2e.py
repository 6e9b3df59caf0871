""" "Why is it waiting?" in real Chromium, at desktop and phone width: a job
in a paused queue says so in its row and on its page, and runs once the
queue is resumed."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_a_paused_queue_is_named_in_the_row_and_on_the_page_until_resumed(live, page, dialogs, width):
    assert page.request.post(f"{live.url}/api/queues/reports/pause").ok
    r = page.request.post(f"{live.url}/api/jobs", data={"type": "demo.report", "payload": {"name": "q3"}})
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    assert r.json()["waiting_reason"]["code"] == "queue_paused"

    page.goto(f"{live.url}/jobs/pending")
    reason = page.locator(f"#job-{job_id} .waiting-reason")
    expect(reason).to_have_text("Waiting: Queue reports is paused")
    live.shot(page, f"waiting-row-{width}")
    page.locator(f"#job-{job_id} td.id a").click()  # the id opens the job; the type filters the list
    line = page.locator("#job-live .waiting-reason")
    expect(line).to_have_text("Waiting: Queue reports is paused")
    box = line.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    live.shot(page, f"waiting-paused-{width}")

    assert page.request.post(f"{live.url}/api/queues/reports/resume").ok
    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=15000)
    expect(line).to_have_count(0)
    assert dialogs == []
