"""Snooze in real Chromium, at desktop and phone width: the job page's
timeline shows the snoozed attempt ("snoozed for 2 s") live, then the
attempt that completes the job, with no retry counted."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_the_timeline_shows_a_snooze_then_the_run_that_completes(live, page, dialogs, width):
    r = page.request.post(
        f"{live.url}/api/jobs", data={"type": "demo.snooze", "payload": {"seconds": 2, "times": 1}, "max_retries": 0}
    )
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    page.goto(f"{live.url}/jobs/{job_id}")
    snoozed = page.locator("#job-timeline .attempt.outcome-snoozed")
    expect(snoozed.locator(".snooze-line")).to_have_text("snoozed for 2 s: demo: snooze 1 of 1", timeout=15000)
    expect(snoozed.locator(".badge")).to_have_text("snoozed")
    box = snoozed.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    live.shot(page, f"snoozed-{width}")
    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=15000)
    expect(page.locator("#job-timeline .attempt.outcome-completed")).to_have_count(1)
    expect(snoozed).to_have_count(1)
    assert live.deck.store.get(job_id).retry_count == 0
    assert dialogs == []
