"""A bulk action whose next batch gets no answer says it was cut short.

"Retry all matching" posts each next batch when the last one's progress is
shown; here the browser's second request is cut off (as when the server
dies mid-action). The progress box must not keep saying "500 of 510…"
forever: it says the action was interrupted, and where the exact count is."""

from __future__ import annotations

import pytest
from jobdeck.store import Outcome
from jobdeck.store.reads import BATCH
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_a_bulk_action_cut_off_mid_way_says_so_on_its_page(make_live, page, dialogs):
    live = make_live(workers=0)  # no worker takes the retried jobs back to dead meanwhile
    n = BATCH + 10
    deck = live.deck
    deck.enqueue_many([{"type": "demo.fail", "payload": {"n": i}} for i in range(n)])
    claimed = deck.store.claim("w1", deck.clock(), limit=n)
    deck.store.fail_many([Outcome(j.id, "w1", attempt=j.attempt, error="boom", retryable=False) for j in claimed],
                         deck.clock())  # fmt: skip
    assert deck.store.counts(deck.clock())["dead"] == n

    posted: list[str] = []

    def cut_after_the_first(route):
        posted.append(route.request.url)
        if len(posted) == 1:
            route.continue_()
        else:
            route.abort("connectionreset")

    page.route("**/actions/matching/retry", cut_after_the_first)
    page.goto(f"{live.url}/jobs/dead")
    page.get_by_role("button", name="Retry all matching…").click()
    page.get_by_role("button", name=f"Retry all {n:,} matching").click()
    box = page.locator("#confirm .bulk-progress")
    expect(box).to_have_class("confirm bulk-progress is-interrupted", timeout=15000)
    expect(box).to_contain_text(
        f"Interrupted after at least {BATCH:,} of {n:,} retried: the next batch did not go through."
    )
    expect(box.get_by_role("link", name="Audit log")).to_be_visible()
    expect(box.get_by_role("button", name="Close")).to_be_visible()
    assert len(posted) == 2 and dialogs == []
    assert live.deck.store.counts(live.deck.clock())["pending"] == BATCH
