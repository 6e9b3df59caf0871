"""A workflow's graph in real Chromium, with a real worker pool running its
jobs: the nodes turn green live as they complete; then a dead node, with
its dependent held (``on_dependency_failure="hold"``), is retried from the
page, and the held dependent runs and turns green."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from playwright.sync_api import expect

from tests.helpers import BUTTON_BOXES

pytestmark = pytest.mark.e2e


def _node(page, job_id):
    return page.locator(f'#workflow-graph .wf-node[data-job="{job_id}"]')


def _fits(page) -> None:
    """Nothing on the page needs a horizontal scroll (a wide graph scrolls
    inside its own box), and every button is on screen."""
    viewport = page.viewport_size["width"]
    for text, box in page.evaluate(BUTTON_BOXES):
        assert box["x"] >= 0 and box["x"] + box["width"] <= viewport + 0.5, (text, box)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= viewport


def test_the_graph_turns_green_live_then_a_dead_node_is_retried_from_the_page(live, page, dialogs, width):
    # "a" sleeps long enough that the page sees the diamond before it finishes
    # (2 s was not, on a slow machine in a full run).
    wf = (
        live.deck.workflow("diamond")
        .add("a", "demo.sleep", {"seconds": 8})
        .add("b", "demo.noop", depends_on=["a"])
        .add("c", "demo.noop", depends_on=["a"])
        .add("d", "demo.noop", depends_on=["b", "c"])
        .enqueue()
    )
    page.goto(f"{live.url}/workflows")
    page.get_by_role("link", name="diamond").click()
    expect(page.locator("#workflow-graph")).to_be_visible()
    expect(_node(page, wf.jobs["d"])).to_have_attribute("data-state", "blocked")
    assert live.deck.store.get(wf.jobs["d"]).status is State.BLOCKED  # not finished behind the page's back
    for step in ("a", "b", "c", "d"):
        expect(_node(page, wf.jobs[step])).to_have_attribute("data-state", "completed", timeout=20000)
    expect(page.locator("#workflow-state")).to_have_text("completed")
    expect(page.locator(f'.workflow-jobs tr[data-job="{wf.jobs["d"]}"] .badge')).to_have_text("Completed")
    _fits(page)
    live.shot(page, f"workflow-completed-{width}")

    held = (
        live.deck.workflow("held", on_dependency_failure="hold")
        .add("x", "demo.noop")
        .add("y", "demo.flaky", {"failures": 1}, depends_on=["x"], max_retries=0)
        .add("z", "demo.noop", depends_on=["y"])
        .enqueue()
    )
    page.goto(f"{live.url}/workflows/{held.id}")
    expect(_node(page, held.jobs["y"])).to_have_attribute("data-state", "dead", timeout=20000)
    expect(page.locator("#workflow-state")).to_have_text("held")
    expect(_node(page, held.jobs["z"])).to_have_attribute("data-state", "blocked")
    expect(page.locator(".wf-held")).to_contain_text("held behind a failed dependency")
    _fits(page)
    live.shot(page, f"workflow-held-{width}")
    page.get_by_role("button", name="Retry failed part (1)").click()
    confirm = page.locator("#confirm .confirm")
    expect(confirm).to_contain_text("Retry 1 failed job")
    confirm.get_by_role("button", name="Retry 1 job").click()
    expect(page.locator(".flash-success")).to_contain_text("1 job retried")
    expect(page.locator("#confirm")).to_be_empty()
    expect(_node(page, held.jobs["y"])).to_have_attribute("data-state", "completed", timeout=20000)
    expect(_node(page, held.jobs["z"])).to_have_attribute("data-state", "completed", timeout=20000)
    expect(page.locator("#workflow-state")).to_have_text("completed")
    assert live.deck.store.get(held.jobs["y"]).attempt == 2
    live.shot(page, f"workflow-retried-{width}")
    assert dialogs == []
