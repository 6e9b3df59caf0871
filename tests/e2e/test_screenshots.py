"""The README's screenshots, reproducible: a live Jobdeck with realistic demo
data (the last hour's per-minute counters as the roll-up would have written
them, schedules that fired over the last hour, a gone worker, a paused
queue, a workflow waiting on its first step and a finished one, a batch),
each main page saved to test-results/screenshots/. With
JOBDECK_UPDATE_SCREENSHOTS=1 the overview, schedules and phone shots are
also copied to static/screenshots/ for the README. The phone shots (390 px,
the first screen only) keep the committed PNGs small."""

from __future__ import annotations

import math
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from jobdeck.maintenance.upkeep import Maintenance
from jobdeck.store.models import maintenance_marks, stats_minutely
from jobdeck.store.upkeep import STATS_MARK
from playwright.sync_api import expect

from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README_SHOTS = ("overview", "schedules", "phone-dead-letter")
PHONE = {"width": 390, "height": 844}

SCHEDULES = [
    {"name": "nightly-sales-report", "cron": "0 2 * * *", "type": "demo.report",
     "payload": {"name": "sales", "rows": 40}},
    {"name": "welcome-emails", "cron": "* * * * *", "type": "demo.send-email", "payload": {"user_id": "new-signups"},
     "misfire": "skip"},
    {"name": "invoice-sync", "cron": "*/15 * * * *", "type": "demo.fail", "max_retries": 0, "misfire": "skip",
     "payload": {"message": "billing API answered 503 Service Unavailable"}},
    {"name": "weekly-digest", "cron": "0 9 * * 1", "type": "demo.send-email", "payload": {"user_id": "digest"}},
]  # fmt: skip


def _seed_counters(deck, now: datetime) -> None:
    """The hour before now as the roll-up writes it: a daytime wave with a
    burst of failures twenty minutes ago."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    rows = []
    for i in range(59):
        wave = 0.5 + 0.5 * math.sin(i / 9)
        failed = 9 + i % 4 if 36 <= i <= 40 else i % 7 // 5
        rows.append({"minute": start + timedelta(minutes=i), "type": "demo.send-email",
                     "completed": int(40 + 90 * wave), "failed": failed, "dead": failed // 3})  # fmt: skip
    with deck.store.write() as conn:
        conn.execute(stats_minutely.insert(), rows)
        conn.execute(maintenance_marks.insert().values(key=STATS_MARK, value=start + timedelta(minutes=59)))


def _fire_schedules(deck, now: datetime) -> None:
    """Run the schedules' loop body at each fire time of the last hour, as
    the scheduler would have."""
    periodic = deck.schedules
    fires = sorted({f for s in periodic.schedules.values() for f in s.fire_times(now - timedelta(hours=1), now)})
    periodic.enqueue_due_once(fires[0] - timedelta(seconds=2))  # first sight: the watermark
    for fire in fires:
        periodic.enqueue_due_once(fire + timedelta(seconds=1))
    periodic.set_paused("weekly-digest", True, now, "alice")
    periodic.run_now("nightly-sales-report", now, "alice")


def _workflows_and_batches(deck) -> None:
    """A workflow whose first step runs for a while, the rest blocked behind
    it (the overview's Blocked card); one that ran to the end; and a closed
    batch of welcome emails with its callback."""
    monthly = deck.workflow("monthly-close")
    monthly.add("extract-ledger", "demo.sleep", {"seconds": 30})
    monthly.add("reconcile", "demo.noop", {"period": "2026-11"}, depends_on=["extract-ledger"])
    monthly.add("publish-report", "demo.report", {"name": "close-2026-11", "rows": 20}, depends_on=["reconcile"])
    monthly.enqueue()
    nightly = deck.workflow("nightly-sales")
    for region in ("eu", "us", "apac"):
        nightly.add(f"extract-{region}", "demo.noop", {"region": region})
    nightly.add(
        "report", "demo.report", {"name": "sales", "rows": 40}, depends_on=["extract-eu", "extract-us", "extract-apac"]
    )
    nightly.enqueue()
    batch = deck.batch(name="welcome-emails", on_complete="demo.noop")
    batch.add_many([{"type": "demo.noop", "payload": {"user_id": f"u{i}"}} for i in range(12)])
    batch.close()


def test_readme_screenshots(make_live, page, dialogs):
    live = make_live(workers=5, schedules=SCHEDULES)
    deck = live.deck
    now = datetime.now(UTC)
    _seed_counters(deck, now)
    _fire_schedules(deck, now)
    deck.store.register_worker("billing-host:4121:7f3a2c", "billing-host", 4121, 4, now - timedelta(minutes=4))
    Maintenance(deck.store, deck.clock, deck.config.stall_timeout).sweep_once(now)  # silent for minutes: marked gone
    deck.queues.set_paused("mail", True, now, "alice")
    items = [{"type": "demo.noop", "payload": {"n": i}} for i in range(80)]
    items += [{"type": "demo.send-email", "payload": {"user_id": f"u{i}"}, "queue": "mail"} for i in range(24)]
    items += [{"type": "demo.flaky", "payload": {"failures": 1}, "max_retries": 3} for _ in range(8)]
    items += [{"type": "demo.fail", "payload": {"message": f"card declined for order {1000 + i}"}, "max_retries": 1,
               "priority": "high"} for i in range(4)]  # fmt: skip
    items += [{"type": "demo.sleep", "payload": {"seconds": 30}, "priority": "critical"} for _ in range(2)]
    items += [{"type": "demo.report", "payload": {"name": f"monthly-{i}", "rows": 100}, "delay_seconds": 3600 + i * 60}
              for i in range(3)]  # fmt: skip
    deck.enqueue_many(items)
    _workflows_and_batches(deck)

    def settled() -> bool:
        c = deck.store.counts(datetime.now(UTC))
        return c["failed"] == 0 and c["pending"] == 24 and c["running"] == 3 and c["blocked"] == 2

    wait_for(settled, timeout=30, message="the demo jobs never settled")
    page.set_viewport_size({"width": 1400, "height": 900})
    shots = {"overview": "/", "schedules": "/schedules", "queues": "/queues", "workers": "/workers",
             "dead-letter": "/jobs/dead", "running": "/jobs/running", "workflows": "/workflows",
             "batches": "/batches", "errors": "/errors/dead"}  # fmt: skip
    page.goto(live.url + "/")
    for link in ("Workflows", "Batches"):  # what the README's picture lacked before
        expect(page.locator(".mainnav")).to_contain_text(link)
    expect(page.locator(".stat-blocked .stat-value")).to_have_text("2")
    for name, path in shots.items():
        page.goto(live.url + path)
        expect(page.locator("main h1")).to_be_visible()
        page.wait_for_timeout(200)  # let the progress bars' transition finish before the picture
        live.shot(page, name)
    expect(page.locator(".mainnav")).to_contain_text("Schedules")
    page.set_viewport_size(PHONE)
    for name, path in {"phone-dead-letter": "/jobs/dead", "phone-overview": "/"}.items():
        page.goto(live.url + path)
        expect(page.locator("main h1")).to_be_visible()
        page.screenshot(path=str(ROOT / "test-results" / "screenshots" / f"{name}.png"))
    assert dialogs == []
    if os.environ.get("JOBDECK_UPDATE_SCREENSHOTS") == "1":
        for name in README_SHOTS:
            shutil.copyfile(ROOT / "test-results" / "screenshots" / f"{name}.png",
                            ROOT / "static" / "screenshots" / f"{name}.png")  # fmt: skip
