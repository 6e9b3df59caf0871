"""A bulk action cut short by SIGKILL, on SQLite and PostgreSQL.

"Retry all matching" over 20,000 dead jobs is driven against a real ``jobdeck
serve`` the way the dashboard drives it (one batch per request, the next one
posted when the last is shown), and the serve process is SIGKILLed mid-way,
again and again. The killer waits for the worst moment: it watches the jobs
that moved and the audit entry's count, and kills the instant they disagree;
when they never do, at a random moment. After each kill:

- the audit log's count for every bulk action equals the jobs it moved
  (the jobs no longer dead, since no worker runs here);
- the action cut short reads "interrupted after N of M" in the audit log and
  on the jobs page that started it, once a new process serves them.

Before batches counted into the audit entry in their own transaction, a kill
between a batch's commit and the entry's update left the entry 500 short
("moved 5,500, audit 5,000" in 3 of 9 kills), and nothing said the action
had been cut short."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from sqlalchemy import text

from tests.adversarial.cli_process import JobdeckProcess, children, write_config

pytestmark = [pytest.mark.backends, pytest.mark.slow]

JOBS = 20_000
KILLS = 8


def make_dead(deck: Jobdeck, n: int) -> None:
    """``n`` dead jobs through the real enqueue, claim and failure."""
    for start in range(0, n, 5000):
        deck.enqueue_many([{"type": "demo.fail", "payload": {"i": i}} for i in range(start, min(n, start + 5000))])
    while claimed := deck.store.claim("setup", deck.clock(), limit=1000, types=["demo.fail"]):
        outcomes = [Outcome(j.id, "setup", attempt=j.attempt, error="boom", retryable=False) for j in claimed]
        deck.store.fail_many(outcomes, deck.clock())


def moved_and_counted(deck: Jobdeck) -> tuple[int, int]:
    """(jobs retried so far, the bulk entries' counts summed), read in one
    statement: one snapshot on either database."""
    sql = (
        "SELECT (SELECT count(*) FROM jobs WHERE status = 'pending'),"
        " (SELECT coalesce(sum(count), 0) FROM audit_log WHERE action = 'retry all')"
    )
    with deck.store.read() as conn:
        moved, counted = conn.execute(text(sql)).one()
    return int(moved), int(counted)


def bulk_entries(deck: Jobdeck) -> list[tuple[int, int]]:
    with deck.store.read() as conn:
        rows = conn.execute(text("SELECT id, count FROM audit_log WHERE action = 'retry all' ORDER BY id")).all()
    return [(i, c) for i, c in rows]


class Browser:
    """What the dashboard's page does for "Retry all matching": confirm,
    then post each next batch as soon as the last one's fragment arrives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = requests.Session()
        page = self.http.get(f"{url}/jobs/dead", timeout=10).text
        token = re.search(r'"X-CSRFToken": "([^"]+)"', page)
        assert token, "no CSRF token in the page"
        self.headers = {"HX-Request": "true", "X-CSRFToken": token.group(1)}
        self.batches = 0
        self.began = threading.Event()
        """Set as the first batch is posted (the confirmation is shown and clicked)."""

    def run(self) -> None:
        confirm = self.http.get(f"{self.url}/jobs/dead/confirm/retry", headers=self.headers, timeout=10).text
        vals = json.loads(_hx_vals(confirm))
        self.began.set()
        while True:
            fragment = self.http.post(f"{self.url}/actions/matching/retry", data=vals, headers=self.headers, timeout=30)
            fragment.raise_for_status()
            self.batches += 1
            if "hx-post" not in fragment.text:
                return
            vals = json.loads(_hx_vals(fragment.text))


def _hx_vals(html: str) -> str:
    found = re.search(r"hx-vals='([^']+)'", html)
    assert found, html[:500]
    return found.group(1).replace("&#34;", '"').replace("&quot;", '"').replace("&amp;", "&")


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[Callable[[], JobdeckProcess]]:
    config = write_config(tmp_path, database_url=db_url, workers=0, demo=False)
    started: list[JobdeckProcess] = []

    def start() -> JobdeckProcess:
        proc = JobdeckProcess(tmp_path, config, name=f"serve{len(started)}")
        started.append(proc)
        proc.wait_serving()
        return proc

    yield start
    for proc in started:
        kill_hard(proc)


def kill_hard(proc: JobdeckProcess) -> None:
    """SIGKILL the server and the worker process that runs the app."""
    for pid in children(proc.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()


def test_a_killed_bulk_action_counts_exactly_what_it_moved_and_says_it_was_cut_short(
    deck: Jobdeck, serve: Callable[[], JobdeckProcess], backend: str
) -> None:
    make_dead(deck, JOBS)
    rng = random.Random(29)
    caught = kills = 0
    figures: list[str] = []
    last: Shown | None = None
    for _ in range(KILLS):
        server = serve()  # a new process: it shows the last action cut short, then runs the next
        if last is not None:
            last.check(server.url)
        begun_before = len(bulk_entries(deck))
        browser = Browser(server.url)
        driver = threading.Thread(target=_quietly(browser.run), name="bulk-browser", daemon=True)
        driver.start()
        assert browser.began.wait(30), "the browser never got to the confirmation"
        deadline = time.monotonic() + rng.uniform(0.0, 0.4)
        while time.monotonic() < deadline and driver.is_alive():
            moved, counted = moved_and_counted(deck)
            if moved != counted:  # the worst moment: a batch is visible and its count is not
                caught += 1
                break
        kill_hard(server)
        kills += 1
        driver.join(timeout=30)

        moved, counted = moved_and_counted(deck)
        entries = bulk_entries(deck)
        assert moved == counted, (
            f"kill {kills}: {moved} jobs moved but the audit log counts {counted} ({entries})"
        )  # fmt: skip
        if len(entries) == begun_before:
            figures.append("none (killed before the action began)")
            last = None
            continue
        last = Shown.read(deck, *entries[-1])
        figures.append(f"{last.count:,}")
        if moved == JOBS:
            break
    if last is not None:
        reader = serve()
        last.check(reader.url)
    print(
        f"{backend}: {kills} SIGKILLs of jobdeck serve mid 'retry all matching' over {JOBS:,} dead jobs; "
        f"{caught} at a moment the killer saw a batch before its count; moved per action {', '.join(figures)}; "
        "audit count = jobs moved after every kill; each cut-short action shown as interrupted"
    )


class Shown:
    """A bulk action as the database left it after a kill, and what a new
    process must show of it."""

    def __init__(self, entry_id: int, count: int, finished: Any, total: int) -> None:
        self.entry_id, self.count, self.finished, self.total = entry_id, count, finished, total

    @classmethod
    def read(cls, deck: Jobdeck, entry_id: int, count: int) -> Shown:
        with deck.store.read() as conn:
            finished, total = conn.execute(
                text("SELECT finished_at, total FROM audit_log WHERE id = :i"), {"i": entry_id}
            ).one()
        return cls(entry_id, count, finished, total)

    def check(self, url: str) -> None:
        audit_page = requests.get(f"{url}/audit", timeout=10).text
        row = re.search(rf'<tr id="audit-{self.entry_id}"[^>]*data-bulk="(\w+)".*?</tr>', audit_page, re.DOTALL)
        assert row, f"the audit log shows no progress for bulk action {self.entry_id}"
        if self.finished is None:
            shown = f"interrupted after {self.count:,} of {self.total:,}"
            assert row.group(1) == "interrupted" and shown in row.group(0), row.group(0)
            jobs_page = requests.get(f"{url}/jobs/dead", timeout=10).text
            assert 'id="bulk-interrupted"' in jobs_page and shown in jobs_page, "the jobs page does not say so"
        else:
            assert row.group(1) == "finished" and f"{self.count:,} of {self.total:,}" in row.group(0)


def _quietly(fn: Callable[[], Any]) -> Callable[[], None]:
    """The browser's loop ends with a refused connection when the server dies: that is the point."""

    def run() -> None:
        with contextlib.suppress(requests.RequestException, AssertionError):
            fn()

    return run
