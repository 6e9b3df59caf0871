"""Job logs in real Chromium, at desktop and phone width: the log of a
running ``demo.sleep`` streams into its job page line by line while the job
runs (the appending poller), then stops polling once it completed, with
every line once and the HTML a handler logs shown as text."""

from __future__ import annotations

import re

import pytest
from jobdeck.core.states import State
from jobdeck.store.joblogs import lines_of
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e


def test_a_running_jobs_log_streams_into_its_page(make_live, page, width, dialogs, registry):
    @registry.handler("e2e.html-log")
    def html_log(payload, ctx):
        ctx.log("<img src=x onerror=alert(1)> is text")

    live = make_live(logs={"flush_interval": 0.2})
    r = page.request.post(f"{live.url}/api/jobs", data={"type": "demo.sleep", "payload": {"seconds": 8}})
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    wait_for(lambda: live.deck.store.get(job_id).status is State.RUNNING, timeout=10, message="the job starts")
    page.goto(f"{live.url}/jobs/{job_id}")
    lines = page.locator('#job-logs ol.log-lines[data-attempt="1"] li.log-line')
    expect(page.locator("#job-logs summary")).to_contain_text("running")
    expect(lines.first).to_contain_text("sleeping 8 s in 20 steps", timeout=5000)
    expect(lines.nth(2)).to_contain_text("step 2/20")
    # Lines keep arriving while it still runs: the page holds some, not all.
    shown_while_running = lines.count()
    assert live.deck.store.get(job_id).status is State.RUNNING
    assert 2 < shown_while_running < 21
    expect(page.locator("#job-live .badge")).to_have_text("Running")
    live.shot(page, f"job-logs-running-{width}")
    expect(lines.nth(shown_while_running + 2)).to_be_visible(timeout=5000)

    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=15000)
    expect(lines).to_have_count(21)
    expect(lines.last).to_contain_text("step 20/20: slept 8.0 of 8 s")
    texts = lines.locator(".log-msg").all_inner_texts()
    assert texts == [x.message for x in lines_of(live.deck.store, job_id)]  # each once, in order
    expect(page.locator("li.log-poll")).to_have_count(0)  # the polling stopped
    live.shot(page, f"job-logs-done-{width}")

    r = page.request.post(f"{live.url}/api/jobs", data={"type": "e2e.html-log", "payload": {}})
    other = r.json()["id"]
    wait_for(lambda: live.deck.store.get(other).status is State.COMPLETED, timeout=10, message="it completes")
    page.goto(f"{live.url}/jobs/{other}")
    expect(page.locator("#job-logs li.log-line .log-msg")).to_have_text("<img src=x onerror=alert(1)> is text")
    expect(page.locator("#job-logs img")).to_have_count(0)
    assert not re.search("onerror", page.locator("#job-logs").inner_html().replace("onerror=alert(1)&gt;", ""))
    assert dialogs == []
