"""Cancel selected in real Chromium: two running demo.sleep jobs ticked on
the Running tab are asked to stop and end cancelled, never retried."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e


def test_cancel_selected_stops_running_jobs(live, page, dialogs):
    ids = []
    for _ in range(2):
        r = page.request.post(f"{live.url}/api/jobs", data={"type": "demo.sleep", "payload": {"seconds": 60}})
        assert r.status == 201, r.text()
        ids.append(r.json()["id"])
    page.goto(f"{live.url}/jobs/running")
    expect(page.locator("#job-rows input.row-select")).to_have_count(2, timeout=15000)
    page.locator("#select-all").check()
    expect(page.locator("#selected-count")).to_have_text("2 selected")
    button = page.get_by_role("button", name="Cancel selected")
    expect(button).to_have_attribute(
        "title", "Ask the ticked running jobs to stop; each ends cancelled when its attempt ends"
    )
    button.click()
    expect(page.locator(".flash-success")).to_contain_text("2 of 2 selected jobs asked to stop")
    wait_for(
        lambda: all(live.deck.store.get(i).status is State.CANCELLED for i in ids), timeout=5, message="not cancelled"
    )
    assert all(live.deck.store.get(i).retry_count == 0 for i in ids)
    expect(page.locator("#job-rows input.row-select")).to_have_count(0, timeout=5000)
    assert dialogs == []
