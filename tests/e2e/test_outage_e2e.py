"""A storage outage seen from the dashboard in Chromium: an action that
cannot be written shows the server's own words (read-only, disk full), not
a bare status, and works again once the database takes writes."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.outage_support import Limits

pytestmark = pytest.mark.e2e


def test_an_action_during_a_read_only_outage_says_so_and_works_after(live, page, dialogs):
    limits = Limits(live.deck)
    r = page.request.post(f"{live.url}/api/jobs", data={"type": "demo.fail", "payload": {}, "max_retries": 0})
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    wait_for(lambda: live.deck.store.get(job_id).status is State.DEAD, 20, message="the job to be dead")
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Dead letter")

    limits.read_only = True
    live.deck.store.engine.dispose()
    page.get_by_role("button", name="Retry", exact=True).click()
    flash = page.locator(".flash-error")
    expect(flash).to_contain_text("the database's storage is read-only")
    expect(flash).to_contain_text("503")
    assert live.deck.store.get(job_id).status is State.DEAD

    limits.read_only = False
    live.deck.store.engine.dispose()
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.locator(".flash-success")).to_contain_text(f"Job {job_id} retried.")
    assert dialogs == []
