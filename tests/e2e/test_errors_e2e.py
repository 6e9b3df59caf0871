"""The errors page in real Chromium, at desktop and phone width: failing
demo.fail jobs grouped by their masked message, and one group retried with
"Retry all N in this group" while the other group is left alone."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import nav, new_page_ready

pytestmark = pytest.mark.e2e


def _fail(live, page, message: str) -> int:
    body = {"type": "demo.fail", "payload": {"message": message}, "max_retries": 0}
    r = page.request.post(f"{live.url}/api/jobs", data=body)
    assert r.status == 201, r.text()
    return int(r.json()["id"])


def _attempts(live, job_id: int) -> int:
    return len(live.deck.store.attempts_of(job_id))


def test_retry_all_in_one_error_group(live, page, dialogs, width):
    cards = [_fail(live, page, f"card {n} declined") for n in (4242, 1111, 7)]
    [down] = [_fail(live, page, "gateway down")]
    wait_for(lambda: all(_attempts(live, j) == 1 for j in [*cards, down]), timeout=20, message="all failed once")

    page.goto(live.url + "/")
    with new_page_ready(page):  # its "Retry all" buttons are htmx's
        nav(page).get_by_role("link", name="Errors").click()
    group = page.locator("article.error-group", has_text="RuntimeError: card ? declined")
    expect(group).to_contain_text("3", timeout=20000)
    expect(group.get_by_role("link", name=f"#{cards[-1]}")).to_be_visible()  # the newest as the sample
    other = page.locator("article.error-group", has_text="RuntimeError: gateway down")
    expect(other).to_be_visible()
    retry = group.get_by_role("button", name="Retry all 3 in this group")
    expect(retry).to_be_visible()
    box = retry.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    live.shot(page, f"errors-{width}")

    retry.click()
    confirm = page.get_by_role("button", name="Retry all 3 matching")
    expect(confirm).to_be_in_viewport()
    confirm.click()
    expect(page.locator("#confirm")).to_contain_text("3 of 3 retried · done")
    # Retried: each ran (and failed) once more; the other group's job did not.
    wait_for(lambda: all(_attempts(live, j) == 2 for j in cards), timeout=20, message="the group retried")
    assert _attempts(live, down) == 1
    page.goto(f"{live.url}/audit")
    expect(page.locator("table.audit")).to_contain_text("retry all")
    assert dialogs == []
