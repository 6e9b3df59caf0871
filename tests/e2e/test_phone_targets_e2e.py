"""Every dashboard page at phone size (390x844), with realistic data, in
real Chromium: each visible link, button, checkbox, summary and select is a
target at least 44x44 CSS px (WCAG 2.5.5 and the platforms' guideline),
nothing scrolls sideways, neither the page nor a table, no placeholder is
cut off, and the sticky header is one row.

How a target is measured: its own box; a checkbox counts the box of the
<label> around it (a tap on the label ticks it). Links inside running text
(a sentence in a <p>, or the footer) are exempt, as WCAG 2.5.5 exempts
inline targets: making them 44 px tall would break the sentence. Every page's
counts (targets checked, inline links exempt, the smallest target) are
printed, so a run shows what was measured, not only that it passed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from jobdeck.maintenance.upkeep import Maintenance
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import new_page_ready
from tests.e2e.test_screenshots import PHONE, SCHEDULES, _fire_schedules, _seed_counters
from tests.helpers import password_hash

pytestmark = pytest.mark.e2e

MIN = 44
"""The smallest target on a phone, in CSS px."""

HEADER_MAX = 60
"""The sticky top bar on a phone: one row (a 44 px target and its padding)."""

USERS = {"alice": {"password_hash": password_hash("alice-secret"), "role": "operator"}}

MEASURE = """() => {
  const root = document.documentElement;
  const found = {targets: 0, inline: 0, smallest: null, small: [], overflow: [], cut: []};
  const name = (el) => (el.tagName.toLowerCase() + (el.className && el.className.baseVal === undefined && el.className
    ? "." + el.className.trim().split(/\\s+/).join(".") : "") + " '" + (el.textContent || el.getAttribute("aria-label")
    || el.getAttribute("title") || "").trim().replace(/\\s+/g, " ").slice(0, 30) + "'");
  for (const el of document.querySelectorAll("a[href], button, input[type=checkbox], summary, select")) {
    if (!el.checkVisibility({visibilityProperty: true})) { continue; }
    if (el.matches("a:not(.btn)") && el.closest("p, footer")) { found.inline++; continue; }  // inline: exempt
    const box = (el.matches("input[type=checkbox]") && el.closest("label")) || el;
    const r = box.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) { continue; }
    found.targets++;
    const size = Math.min(r.width, r.height);
    if (found.smallest === null || size < found.smallest.size) {
      found.smallest = {size: size, what: name(el), w: r.width, h: r.height};
    }
    if (r.width < MIN - 0.01 || r.height < MIN - 0.01) {
      found.small.push(name(el) + " " + r.width.toFixed(1) + "x" + r.height.toFixed(1));
    }
  }
  if (root.scrollWidth > root.clientWidth + 1) {
    found.overflow.push("the page: " + root.scrollWidth + " px in " + root.clientWidth);
  }
  for (const table of document.querySelectorAll("table")) {
    if (!table.checkVisibility()) { continue; }
    let box = table.parentElement;
    while (box && box !== document.body && !["auto", "scroll", "hidden"].includes(getComputedStyle(box).overflowX)) {
      box = box.parentElement;
    }
    if (box && box !== document.body && box.scrollWidth > box.clientWidth + 1) {
      found.overflow.push("table." + table.className.trim().split(/\\s+/).join(".") + ": " + box.scrollWidth
        + " px in " + box.clientWidth);
    } else if (table.getBoundingClientRect().right > root.clientWidth + 1) {
      found.overflow.push("table." + table.className + " ends at " + table.getBoundingClientRect().right);
    }
  }
  const pen = document.createElement("canvas").getContext("2d");
  for (const field of document.querySelectorAll("input[placeholder]")) {
    if (!field.checkVisibility() || field.value) { continue; }
    const style = getComputedStyle(field);
    pen.font = style.font;
    const room = field.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const text = pen.measureText(field.placeholder).width;
    if (text > room + 1) {
      found.cut.push("the placeholder '" + field.placeholder + "' needs " + text.toFixed(0) + " px, has "
        + room.toFixed(0));
    }
  }
  const bar = document.querySelector(".topbar");
  found.header = bar ? bar.getBoundingClientRect().height : 0;
  return found;
}""".replace("MIN", str(MIN))


def _seed(live) -> dict[str, int]:
    """The screenshot test's demo data (an hour of counters, schedules that
    fired, a gone worker, a paused queue, jobs in every state) plus a
    workflow, a batch, and dead jobs of two types with long errors."""
    deck = live.deck
    now = datetime.now(UTC)
    _seed_counters(deck, now)
    _fire_schedules(deck, now)
    deck.store.register_worker("billing-host:4121:7f3a2c", "billing-host", 4121, 4, now - timedelta(minutes=4))
    Maintenance(deck.store, deck.clock, deck.config.stall_timeout).sweep_once(now)
    deck.queues.set_paused("mail", True, now, "alice")
    items = [{"type": "demo.noop", "payload": {"n": i}} for i in range(30)]
    items += [{"type": "demo.send-email", "payload": {"user_id": f"u{i}"}, "queue": "mail"} for i in range(12)]
    items += [{"type": "demo.fail", "payload": {"message": f"card declined for order {1000 + i}: the issuing bank "
               "answered 'do not honour' (code 05)"}, "max_retries": 1, "priority": "high"} for i in range(4)]  # fmt: skip
    items += [{"type": "demo.fail", "payload": {"message": "billing API answered 503"}, "max_retries": 0,
               "idempotency_key": "invoice-sync-0"}]  # fmt: skip
    items += [{"type": "demo.sleep", "payload": {"seconds": 60}, "priority": "critical"} for _ in range(2)]
    items += [{"type": "demo.report", "payload": {"name": f"monthly-{i}", "rows": 100}, "delay_seconds": 3600 + i * 60}
              for i in range(3)]  # fmt: skip
    deck.enqueue_many(items)
    wf = (
        deck.workflow("nightly-etl")
        .add("extract", "demo.noop")
        .add("transform", "demo.noop", depends_on=["extract"])
        .add("load", "demo.sleep", {"seconds": 60}, depends_on=["transform"])
        .add("notify", "demo.noop", depends_on=["load"])
        .enqueue()
    )
    with deck.batch(name="march-import", on_complete="demo.noop") as batch:
        batch.add_many([{"type": "demo.noop", "payload": {"row": i}} for i in range(5)])

    def settled() -> bool:
        c = deck.store.counts(datetime.now(UTC))
        return c["failed"] == 0 and c["dead"] >= 5 and c["running"] >= 3

    wait_for(settled, timeout=30, message="the demo jobs never settled")
    return {"workflow": wf.id, "batch": batch.id}


def _measure(page, label: str, report: list[str], failures: list[str]) -> None:
    expect(page.locator("main h1").first).to_be_visible()
    page.wait_for_timeout(100)  # the progress bars' transition (layout only, no state waited on)
    found = page.evaluate(MEASURE)
    smallest = found["smallest"]
    report.append(
        f"{label:<22} targets {found['targets']:>3}  inline-exempt {found['inline']:>2}  "
        f"smallest {smallest['w']:.1f}x{smallest['h']:.1f} {smallest['what']}  header {found['header']:.0f} px  "
        f"too small {len(found['small'])}  overflow {len(found['overflow'])}"
    )
    failures += [f"{label}: target {s}" for s in found["small"]]
    failures += [f"{label}: scrolls sideways: {s}" for s in found["overflow"]]
    failures += [f"{label}: cut off: {s}" for s in found["cut"]]
    if found["header"] > HEADER_MAX:
        failures.append(f"{label}: the sticky header is {found['header']:.0f} px tall (at most {HEADER_MAX})")


def test_every_page_fits_a_thumb_at_390px(make_live, page, dialogs):
    live = make_live(workers=4, schedules=SCHEDULES, users=USERS)
    ids = _seed(live)
    page.set_viewport_size(PHONE)
    report: list[str] = []
    failures: list[str] = []

    page.goto(live.url + "/login")
    _measure(page, "sign-in", report, failures)
    page.get_by_label("User").fill("alice")
    page.get_by_label("Password").fill("alice-secret")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("main h1")).to_have_text("Overview")

    page.goto(live.url + "/jobs/dead")
    dead_id = int(page.locator("#job-rows tr[id^=job-]").first.get_attribute("id").removeprefix("job-"))
    pages = {
        "overview": "/",
        **{f"jobs/{tab}": f"/jobs/{tab}" for tab in
           ("pending", "scheduled", "running", "failed", "dead", "completed", "discarded", "cancelled", "blocked")},
        "dead job": f"/jobs/{dead_id}",
        "errors": "/errors",
        "workflows": "/workflows",
        "workflow": f"/workflows/{ids['workflow']}",
        "batches": "/batches",
        "batch": f"/batches/{ids['batch']}",
        "schedules": "/schedules",
        "queues": "/queues",
        "workers": "/workers",
        "audit": "/audit",
    }  # fmt: skip
    for label, path in pages.items():
        page.goto(live.url + path)
        _measure(page, label, report, failures)
    print(f"\nphone targets and overflow at 390x844 (min target {MIN} px):\n  " + "\n  ".join(report))
    assert not failures, f"{len(failures)} problems at 390 px:\n" + "\n".join(failures)
    assert dialogs == []


def _tap(page, locator) -> None:
    """A tap where the element is drawn, whatever is on top of it there (the
    card's stretched link is, on purpose; Playwright's click would refuse)."""
    box = locator.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def test_a_phone_card_opens_its_job_and_the_menu_holds_the_nav(live, page, dialogs):
    """On a phone a dead job's card is one big link to its job, while its
    checkbox and buttons still do their own thing; the nav is behind a Menu
    button that works from the keyboard. At desktop width the nav is in the
    bar and there is no Menu button."""
    ids = live.deck.enqueue_many([{"type": "demo.fail", "payload": {"n": i}, "max_retries": 0} for i in range(2)])
    wait_for(lambda: live.deck.store.counts(datetime.now(UTC))["dead"] == 2, timeout=20, message="both died")
    page.set_viewport_size(PHONE)
    page.goto(live.url + "/jobs/dead")
    card = page.locator(f"#job-{ids[0]}")
    card.locator(".sel-hit").click()
    expect(card.locator("input.row-select")).to_be_checked()  # ticked, not opened
    expect(page.locator("#selected-count")).to_have_text("1 selected")
    _tap(page, card.locator("td.error-cell"))  # the error text is part of the card's link
    expect(page).to_have_url(f"{live.url}/jobs/{ids[0]}")

    page.goto(live.url + "/")
    item = page.locator(".dead-item").first  # the latest dead job of its type: either, as they die together
    shown = item.get_attribute("data-job")
    assert shown in {str(i) for i in ids}, shown
    with new_page_ready(page):  # its Menu button below is dashboard.js's
        _tap(page, item.locator(".error-text"))
    expect(page).to_have_url(f"{live.url}/jobs/{shown}")

    nav = page.locator("nav.mainnav")
    toggle = page.get_by_role("button", name="Menu")
    expect(nav).to_be_hidden()
    toggle.focus()
    page.keyboard.press("Enter")
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(nav.get_by_role("link", name="Schedules")).to_be_visible()
    page.keyboard.press("Escape")
    expect(nav).to_be_hidden()
    expect(toggle).to_be_focused()
    toggle.click()
    nav.get_by_role("link", name="Schedules").click()
    expect(page.locator("main h1")).to_have_text("Schedules")
    expect(nav).to_be_hidden()  # a new page starts with the menu closed

    page.set_viewport_size({"width": 1280, "height": 800})
    expect(nav.get_by_role("link", name="Schedules")).to_be_visible()
    expect(toggle).to_be_hidden()
    assert dialogs == []
