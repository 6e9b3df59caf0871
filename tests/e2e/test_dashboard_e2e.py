"""The dashboard in real Chromium against a live server with real workers."""

from __future__ import annotations

import time

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.e2e.conftest import new_page_ready

pytestmark = pytest.mark.e2e


def _api(live, page, body):
    r = page.request.post(f"{live.url}/api/jobs", data=body)
    assert r.status == 201, r.text()
    return r.json()["id"]


def test_api_enqueued_job_appears_without_reload(live, page, dialogs):
    page.goto(f"{live.url}/jobs/completed")
    marker = page.evaluate("() => (window.__marker = Math.random())")
    job_id = _api(live, page, {"type": "demo.noop", "payload": {"hello": "world"}})
    expect(page.locator(f"#job-{job_id}")).to_be_visible(timeout=15000)
    expect(page.locator("#tabs .tab.active .count")).not_to_have_text("0")
    assert page.evaluate("() => window.__marker") == marker  # same document: no reload
    page.goto(live.url + "/")
    expect(page.locator(".stat-completed .stat-value")).to_have_text("1")
    live.shot(page, "overview-first-job")
    assert dialogs == []


def test_failing_job_lands_in_dead_letter_with_both_attempts_then_retry(live, page, dialogs):
    job_id = _api(live, page, {"type": "demo.fail", "payload": {"message": "card declined"}, "max_retries": 1})
    page.goto(f"{live.url}/jobs/dead")
    row = page.locator(f"#job-{job_id}")
    expect(row).to_be_visible(timeout=20000)
    expect(row).to_contain_text("card declined")
    live.shot(page, "dead-letter")
    with new_page_ready(page):  # its Retry button below is htmx's
        row.locator("a").first.click()
    expect(page.locator("#job-live .badge")).to_have_text("Dead letter")
    timeline = page.locator(".timeline .attempt")
    expect(timeline).to_have_count(2)
    expect(page.locator(".timeline")).to_contain_text("Attempt 1")
    expect(page.locator(".timeline")).to_contain_text("Attempt 2")
    page.locator("details.traceback summary").first.click()
    expect(page.locator("details.traceback pre").first).to_contain_text("RuntimeError: card declined")
    live.shot(page, "job")
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.locator(".flash-success")).to_contain_text(f"Job {job_id} retried.")
    # Back to work with a fresh retry budget: two more attempts (demo.fail
    # always fails), watched live on this page, and then dead letter again.
    expect(page.locator(".timeline .attempt")).to_have_count(4, timeout=20000)
    expect(page.locator("#job-live .badge")).to_have_text("Dead letter")
    assert dialogs == []


def test_discard_all_matching_empties_a_filtered_list(live, page, dialogs):
    for n in range(4):
        _api(live, page, {"type": "demo.fail", "payload": {"batch": "b1", "n": n}, "max_retries": 0})
    other = _api(live, page, {"type": "demo.flaky", "payload": {"failures": 9}, "max_retries": 0})
    page.goto(f"{live.url}/jobs/dead?type=demo.fail")
    expect(page.locator("#job-rows tr.empty-row")).to_have_count(0, timeout=20000)
    expect(page.locator("#job-rows tr")).to_have_count(4, timeout=20000)
    page.get_by_role("button", name="Discard all matching…").click()
    confirm = page.get_by_role("button", name="Discard all 4 matching")
    expect(confirm).to_be_visible()
    page.wait_for_timeout(1500)  # a poll or two pass: the open confirmation must survive them
    expect(confirm).to_be_visible()
    live.shot(page, "confirm")
    confirm.click()
    expect(page.locator("#confirm")).to_contain_text("4 of 4 discarded")
    expect(page.locator("#job-rows")).to_contain_text("No dead letter jobs match this filter.")
    assert live.deck.store.get(other).status is State.DEAD
    page.goto(f"{live.url}/audit")
    expect(page.locator("table.audit")).to_contain_text("discard all")
    live.shot(page, "audit")
    assert dialogs == []


def test_edit_and_retry_a_dead_job_with_a_corrected_payload(live, page, dialogs):
    job_id = _api(live, page, {"type": "demo.flaky", "payload": {"failures": 99}, "max_retries": 0})
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Dead letter", timeout=20000)
    page.locator("details.edit-retry summary").click()
    page.locator("textarea[name=payload]").fill("{not json")
    page.get_by_role("button", name="Retry with this payload").click()
    expect(page.locator(".field-error")).to_contain_text("Not valid JSON")
    page.locator("textarea[name=payload]").fill('{"failures": 0}')
    page.get_by_role("button", name="Retry with this payload").click()
    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=20000)
    expect(page.locator(".old-payload")).to_have_count(1)
    page.locator(".old-payload summary").click()
    expect(page.locator(".old-payload pre")).to_contain_text('"failures": 99')
    assert live.deck.store.get(job_id).result == {"succeeded_on_attempt": 2}
    assert dialogs == []


def test_selection_survives_polls_and_script_payloads_stay_text(live, page, dialogs):
    evil = '<script>alert("xss")</script><img src=x onerror=alert(1)>'
    ids = [_api(live, page, {"type": "demo.fail", "payload": {"note": evil}, "max_retries": 0}) for _ in range(2)]
    page.goto(f"{live.url}/jobs/dead")
    expect(page.locator("#job-rows input.row-select")).to_have_count(2, timeout=20000)
    page.locator(f"#job-{ids[0]} input.row-select").check()
    page.locator("input[name=q]").fill("half-typed")
    page.wait_for_timeout(2500)  # two polls pass
    expect(page.locator(f"#job-{ids[0]} input.row-select")).to_be_checked()
    expect(page.locator("input[name=q]")).to_have_value("half-typed")
    expect(page.locator("#selected-count")).to_have_text("1 selected")
    page.get_by_role("button", name="Retry selected").click()
    expect(page.locator(".flash-success")).to_contain_text("1 of 1 selected jobs retried.")
    page.goto(f"{live.url}/jobs/{ids[1]}")
    expect(page.locator("pre.json").first).to_contain_text("<img src=x onerror=alert(1)>")
    page.goto(f"{live.url}/workers")
    expect(page.locator("#workers-live")).to_contain_text("threads busy")
    live.shot(page, "workers-busy")
    assert dialogs == []


def test_a_click_right_after_a_poll_replaced_the_rows_acts_on_the_ticked_rows(live, page, dialogs):
    """A poll's new rows come unticked from the server; the page ticks them
    again from its selection. It did so when htmx settled the swap, a timer
    after it (20 ms, longer in a busy browser), and a click on "Retry
    selected" in between sent no row at all: "Select some jobs first", the
    job left dead, the page still saying "1 selected" (seen once in a quiet
    run). The rows are now ticked in the swap's own task. Here the settle is
    put off for 30 s, as a browser too busy to run the timer would, so the
    click lands in that gap every time."""
    ids = [_api(live, page, {"type": "demo.fail", "payload": {}, "max_retries": 0}) for _ in range(2)]
    page.goto(f"{live.url}/jobs/dead")
    expect(page.locator("#job-rows input.row-select")).to_have_count(2, timeout=20000)
    page.locator(f"#job-{ids[0]} input.row-select").check()
    expect(page.locator("#selected-count")).to_have_text("1 selected")
    page.evaluate("""() => {
        htmx.config.defaultSettleDelay = 30000;
        document.getElementById("job-rows").setAttribute("data-before-poll", "");
        htmx.trigger(document.body, "jd-poll");
    }""")
    expect(page.locator("#job-rows[data-before-poll]")).to_have_count(0)  # the poll's rows are in, not settled
    expect(page.locator(f"#job-{ids[0]} input.row-select")).to_be_checked()
    page.get_by_role("button", name="Retry selected").click()
    expect(page.locator(".flash-success")).to_contain_text("1 of 1 selected jobs retried.")
    # The ticked job left its first death (pending, or already on its second
    # attempt: demo.fail fails again); the other is as it was.
    retried, other = (live.deck.store.get(i) for i in ids)
    assert (retried.status, retried.attempt) != (State.DEAD, 1)
    assert (other.status, other.attempt) == (State.DEAD, 1)
    assert dialogs == []


def test_cancel_a_running_sleep_from_its_page(live, page, dialogs, width):
    """Cancel a running demo.sleep on its job page: it is cancelled within
    2 s (the handler waits on ctx.cancelled) and never retried."""
    job_id = _api(live, page, {"type": "demo.sleep", "payload": {"seconds": 60}, "max_retries": 3})
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Running", timeout=15000)
    page.get_by_text("Cancel…").click()
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator(".flash-success")).to_contain_text(f"Job {job_id} is asked to stop")
    expect(page.locator("#job-live .badge")).to_have_text("Cancelled", timeout=2000)
    expect(page.locator(".timeline .attempt")).to_have_count(1)
    job = live.deck.store.get(job_id)
    assert job.status is State.CANCELLED and job.attempt == 1 and job.retry_count == 0
    live.shot(page, f"job-cancelled-{width}")
    assert dialogs == []


def test_an_action_answered_after_a_poll_still_shows_its_result(live, page, dialogs):
    """The rows poll and "Retry selected" both replace the rows. A poll
    that replaced them while the action was in flight made htmx drop the
    action's answer, its message included: the jobs were retried and the
    operator was not told (seen under load). The poll now gives way to an
    action in flight. The action's answer is held here while a poll is asked
    for, so the race happens every time."""
    ids = [_api(live, page, {"type": "demo.fail", "payload": {}, "max_retries": 0}) for _ in range(2)]
    page.goto(f"{live.url}/jobs/dead")
    expect(page.locator("#job-rows input.row-select")).to_have_count(2, timeout=20000)
    page.locator(f"#job-{ids[0]} input.row-select").check()
    held = []
    page.route("**/actions/selected/retry", lambda route: held.append(route))
    page.get_by_role("button", name="Retry selected").click()
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)  # polling for the held request, with a deadline
    assert held, "the action's request never left"
    page.evaluate("htmx.trigger(document.body, 'jd-poll')")
    page.wait_for_timeout(1000)  # room for a poll that is not dropped to come back and replace the rows
    held[0].continue_()
    expect(page.locator(".flash-success")).to_contain_text("1 of 1 selected jobs retried.")
    expect(page.locator(f"#job-{ids[0]}")).to_have_count(0)
    expect(page.locator(f"#job-{ids[1]}")).to_have_count(1)
