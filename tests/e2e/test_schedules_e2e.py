"""The Schedules and Queues pages in real Chromium: actions answer in place
(no reload), the table refreshes by itself, run-now links open the job."""

from __future__ import annotations

import re

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

SCHEDULES = [
    {"name": "nightly-report", "cron": "0 2 * * *", "type": "demo.report", "payload": {"name": "nightly", "rows": 20}},
    {"name": "every-minute-email", "cron": "* * * * *", "type": "demo.send-email", "payload": {"user_id": "u1"},
     "misfire": "skip"},
]  # fmt: skip


def test_pause_resume_and_run_now_in_place(make_live, page, dialogs):
    live = make_live(schedules=SCHEDULES)
    page.goto(f"{live.url}/schedules")
    expect(page).to_have_title("Schedules · Jobdeck")
    nightly = page.locator('tr[data-schedule="nightly-report"]')
    expect(nightly).to_contain_text("every day at 02:00 UTC")
    expect(page.locator('tr[data-schedule="every-minute-email"]')).to_contain_text("every minute (UTC)")
    marker = page.evaluate("() => (window.__marker = Math.random())")

    nightly.get_by_role("button", name="Pause").click()
    expect(page.locator(".flash-success")).to_contain_text("nightly-report: paused")
    expect(nightly.locator(".badge-paused")).to_be_visible()
    expect(nightly.locator(".next-run")).to_have_text("paused")
    nightly.get_by_role("button", name="Resume").click()
    expect(page.locator(".flash-success")).to_contain_text("nightly-report: resumed")
    expect(nightly.locator(".badge-paused")).to_have_count(0)
    expect(nightly.locator(".next-run time")).to_have_text(re.compile(r"^in "))

    nightly.get_by_role("button", name="Run now").click()
    expect(page.locator(".flash-success")).to_contain_text("nightly-report: enqueued job #")
    job_id = int(re.search(r"#(\d+)", page.locator(".flash-success").inner_text()).group(1))
    link = nightly.locator(f'.last-run a[href="/jobs/{job_id}"]')
    expect(link).to_have_text(f"#{job_id}")
    expect(nightly.locator(".last-run .badge")).to_have_text("Completed", timeout=15000)  # refreshed by polling
    assert page.evaluate("() => window.__marker") == marker  # same document throughout
    live.shot(page, "schedules-after-run-now")
    link.click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job_id}$"))
    expect(page.locator("#job-live .badge")).to_have_text("Completed")
    audit = [e.action for e in _audit(live)]
    assert audit[:3] == ["schedule.run", "schedule.resume", "schedule.pause"]
    assert dialogs == []


def _audit(live):
    from jobdeck.store.audit import list_audit

    return list_audit(live.deck.store)[0]


def test_paused_queue_holds_its_jobs_until_resumed(make_live, page, dialogs):
    live = make_live()
    page.goto(f"{live.url}/queues")
    row = page.locator('tr[data-queue="default"]')
    page.get_by_role("button", name="Pause queue default").click()
    expect(page.locator(".flash-success")).to_contain_text("queue default: paused")
    expect(row.locator(".badge")).to_have_text("paused")
    job, _ = live.deck.enqueue("demo.noop", {})
    expect(row.locator("td.num").first).to_have_text("1")  # the poll shows it waiting
    page.wait_for_timeout(1000)  # workers poll meanwhile: a paused queue is not claimed from
    assert live.deck.store.get(job.id).status is State.PENDING
    live.shot(page, "queues-paused")
    page.get_by_role("button", name="Resume queue default").click()
    expect(row.locator(".badge")).to_have_text("active")
    wait_for(lambda: live.deck.store.get(job.id).status is State.COMPLETED, timeout=10)
    expect(row.locator("td.num").first).to_have_text("0")
    assert dialogs == []
