"""Editing a scheduled job from its page, and the Queues page's per-type
health, in real Chromium at desktop and phone width (``width``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.maintenance.upkeep import Maintenance
from jobdeck.store.audit import list_audit
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e


def _fits(page) -> bool:
    """Nothing wider than the viewport: no sideways scrolling on a phone."""
    return bool(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"))


def test_edit_a_scheduled_jobs_payload_and_run_at_from_its_page(live, page, dialogs, width):
    r = page.request.post(f"{live.url}/api/jobs", data={"type": "demo.noop", "payload": {"to": "old@example.com"},
                                                        "delay_seconds": 3600})  # fmt: skip
    job_id = r.json()["id"]
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Scheduled")
    page.locator("details.edit-job summary").click()
    form = page.locator("form.edit-form")
    expect(form).to_be_visible()
    assert _fits(page), f"the edit form overflows at {width} width"
    page.locator("textarea[name=payload]").fill('{"to": "new@example.com"}')
    page.locator("input[name=priority]").fill("nope")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator(".field-error")).to_contain_text("unknown priority")
    expect(page.locator("textarea[name=payload]")).to_have_value('{"to": "new@example.com"}')  # what was typed stays
    page.locator("input[name=priority]").fill("high")
    later = (datetime.now(UTC) + timedelta(hours=5)).replace(second=0, microsecond=0)
    page.locator("input[name=run_at]").fill(later.strftime("%Y-%m-%dT%H:%M"))
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator(".flash-success")).to_contain_text(f"Job {job_id} edited")
    expect(page.locator(".two-col pre.json").first).to_contain_text("new@example.com")
    expect(page.locator("#job-live .badge")).to_have_text("Scheduled")
    expect(page.locator("#job-live")).to_contain_text("high")
    expect(page.locator("input[name=run_at]")).to_have_value(re.compile(later.strftime("%Y-%m-%dT%H:%M")))
    job = live.deck.store.get(job_id)
    assert (job.status, job.payload, job.priority, job.available_at) == (
        State.PENDING, {"to": "new@example.com"}, 20, later,
    )  # fmt: skip
    entries, _ = list_audit(live.deck.store)
    assert entries[0].action == "edit" and "priority 0 → 20" in entries[0].detail
    live.shot(page, f"job-edited-{width}")
    assert dialogs == []


def test_the_queues_page_shows_a_types_run_times_after_demo_jobs_ran(live, page, dialogs, width):
    deck = live.deck
    deck.enqueue_many([{"type": "demo.sleep", "payload": {"seconds": 0.1}} for _ in range(6)])
    wait_for(lambda: deck.store.counts(datetime.now(UTC))["completed"] == 6, timeout=20, message="sleeps done")
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    later = datetime.now(UTC) + timedelta(minutes=3)  # close the current minute too
    m.rollup_once(later)  # a new database: the watermark an hour back
    m.rollup_once(later)
    page.goto(f"{live.url}/queues")
    row = page.locator('table.type-health[data-window="1 h"] tr[data-type="demo.sleep"]')
    expect(row.locator("td.p50")).to_have_text(re.compile(r"^≈ \d+(\.\d+)? ms$"))
    expect(row.locator("td.p95")).to_have_text(re.compile(r"^≈ \d+(\.\d+)? ms$"))
    expect(row.locator("td.pct")).to_have_text("0.0%")
    completed = row.locator("td.secondary").first
    if width == "phone":
        expect(completed).to_be_hidden()  # the counts give way; failure rate and run times stay
    else:
        expect(completed).to_have_text("6")
    assert _fits(page), f"the Queues page overflows at {width} width"
    page.wait_for_timeout(1500)  # a poll or two pass: the table is refreshed, not duplicated
    expect(page.locator("#type-health")).to_have_count(1)
    live.shot(page, f"queues-health-{width}")
    assert dialogs == []
