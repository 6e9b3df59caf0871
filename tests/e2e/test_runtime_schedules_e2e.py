"""A runtime schedule made in real Chromium, on one of two real Jobdeck
processes sharing the database: it shows on both, fires once per fire time
across them, is edited and deleted in the browser, and stops firing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from jobdeck.store import Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import jobs
from playwright.sync_api import expect
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import wait_for
from tests.two_processes import TwoProcesses

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.backends]


def test_a_schedule_made_in_the_browser_fires_once_across_two_processes(db_url, tmp_path, page, dialogs):
    procs = TwoProcesses(db_url, tmp_path)
    engine = make_engine(db_url, pool_size=2)
    store = Store(engine)

    def fired() -> int:
        procs.check_alive()
        try:
            with store.read() as conn:
                stmt = select(func.count()).where(jobs.c.idempotency_key.like("schedule:browser tick/1:%"))
                return int(conn.execute(stmt).scalar_one())
        except SQLAlchemyError:
            return 0

    try:
        wait_for(procs.up, 60, interval=0.2, message="both processes serve")
        page.goto(f"{procs.url(0)}/schedules")
        page.get_by_role("link", name="New schedule").click()
        expect(page).to_have_title("New schedule · Jobdeck")
        page.get_by_label("Name").fill("browser tick/1")
        page.get_by_label("Cron").fill("* * * * * *")
        page.get_by_label("Job type").select_option("demo.noop")
        page.get_by_label("Payload").fill('{"from": "<browser>"}')
        page.get_by_role("button", name="Create schedule").click()
        created = datetime.now(UTC)
        expect(page.locator(".flash-success")).to_contain_text("browser tick/1: created; it fires every second")
        row = page.locator('tr[data-schedule="browser tick/1"]')
        expect(row.locator(".badge-source")).to_have_text("runtime")
        expect(row.locator(".last-run .badge")).to_have_text("Completed", timeout=20000)  # the table polls

        other = page.context.new_page()  # the other process shows it too, and fires it
        other.goto(f"{procs.url(1)}/schedules")
        expect(other.locator('tr[data-schedule="browser tick/1"] .badge-source')).to_have_text("runtime")
        wait_for(lambda: "changed: browser tick/1" in procs.logs[1].read_text(), 20, message="the other picks it up")
        wait_for(lambda: fired() >= 5, 60, interval=0.2, message="five fire times")
        with store.read() as conn:
            keys = list(conn.execute(select(jobs.c.idempotency_key).where(
                jobs.c.idempotency_key.like("schedule:browser tick/1:%"))).scalars())  # fmt: skip
        span = (datetime.now(UTC) - created).total_seconds()
        assert len(keys) == len(set(keys)) and len(keys) <= span + 2, f"{len(keys)} jobs in {span:.1f} s"

        row.get_by_role("link", name="Edit").click()
        expect(page.get_by_label("Cron")).to_have_value("* * * * * *")
        page.get_by_label("Cron").fill("not a cron")
        page.get_by_role("button", name="Save changes").click()
        expect(page.locator(".field-error")).to_contain_text("invalid cron expression 'not a cron'")
        expect(page.get_by_label("Cron")).to_have_value("not a cron")  # what was typed stays
        page.get_by_label("Cron").fill("0 3 * * *")
        page.get_by_role("button", name="Save changes").click()
        expect(page.locator(".flash-success")).to_contain_text("browser tick/1: saved; it fires every day at 03:00")
        row.get_by_role("link", name="Edit").click()
        page.get_by_role("button", name="Delete this schedule").click()
        expect(page.locator(".flash-success")).to_contain_text("browser tick/1: deleted")
        wait_for(lambda: "picked up: 0 in all; changed: browser tick/1" in procs.logs[1].read_text(), 20,
                 message="the other process sees the delete")  # fmt: skip
        settled = fired()
        page.wait_for_timeout(2500)  # a quiet stretch: nothing fires once it is gone
        assert fired() <= settled + 1
        audit = [e.action for e in _audit(store)]
        assert audit[:3] == ["schedule.delete", "schedule.update", "schedule.create"]
        assert dialogs == []
    finally:
        procs.stop()
        engine.dispose()


def _audit(store):
    from jobdeck.store.audit import list_audit

    return list_audit(store)[0]
