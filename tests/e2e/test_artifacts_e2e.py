"""Reports in real Chromium, at desktop and phone width: a ``demo.report``
run by the live worker pool shows its CSV on the job page, and a click
downloads exactly the bytes the database holds; the Schedules page links
the last successful run's report one click away."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.store.artifacts import get_artifact
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

NIGHTLY = {
    "name": "nightly-sales",
    "cron": "0 2 * * *",
    "type": "demo.report",
    "payload": {"name": "sales", "rows": 40},
}


def _downloaded(page, link) -> tuple[str, bytes]:
    with page.expect_download() as caught:
        link.click()
    download = caught.value
    return download.suggested_filename, Path(download.path()).read_bytes()


def test_download_a_report_from_its_job_page(make_live, page, width, dialogs):
    live = make_live()
    r = page.request.post(
        f"{live.url}/api/jobs", data={"type": "demo.report", "payload": {"name": "é sales", "rows": 30}}
    )
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=20000)
    link = page.locator('#job-artifacts li.artifact[data-name="é-sales.csv"] a')
    expect(link).to_be_visible(timeout=10000)  # the list refreshes itself until the job is done
    expect(page.locator("#job-artifacts")).to_contain_text("B · text/csv; charset=utf-8")
    live.shot(page, f"artifacts-job-{width}")
    name, data = _downloaded(page, link)
    assert name == "é-sales.csv"  # from filename*, in UTF-8
    assert data == get_artifact(live.deck.store, job_id, "é-sales.csv").data
    assert data.startswith(b"row,value\r\n0,0\r\n1,1\r\n") and data.count(b"\r\n") == 31
    assert dialogs == []


def test_the_schedules_page_links_the_last_good_report(make_live, page, width, dialogs):
    live = make_live(schedules=[NIGHTLY])
    job = live.deck.schedules.run_now("nightly-sales", live.deck.clock(), "e2e")
    wait_for(lambda: live.deck.store.get(job.id).status is State.COMPLETED, timeout=20, message="the run completes")
    page.goto(f"{live.url}/schedules")
    row = page.locator('tr[data-schedule="nightly-sales"]')
    link = row.locator("a.artifact-link", has_text="sales.csv")
    expect(link).to_be_visible()
    expect(row.locator(".last-artifacts")).to_contain_text("Last successful run:")
    live.shot(page, f"artifacts-schedules-{width}")
    name, data = _downloaded(page, link)
    assert name == "sales.csv"
    assert data == get_artifact(live.deck.store, job.id, "sales.csv").data
    assert data.count(b"\r\n") == 41
    assert dialogs == []
