"""Issue 11: what the dashboard showed new users that was not true, each
checked against the real store (the browser side is tests/e2e/test_truth_e2e.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from dashboard_support import HTMX, make_dash_app, make_dead
from jobdeck.core.states import State
from jobdeck.store import Outcome
from jobdeck.store.overview import Snapshots, queue_latency
from jobdeck.web.dashboard.present import attempts_allowed

from tests.helpers import password_hash


class Ticks:
    """A monotonic clock the test moves (the snapshot cache's ages)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached_dash(deck, ttl: float = 3.0):
    """A dashboard with the snapshot cache on, its ages on a test clock."""
    app = make_dash_app(deck, dashboard={"counts_cache_seconds": ttl})
    ticks = Ticks()
    app.extensions["jobdeck_snapshots"].monotonic = ticks
    return app.test_client(), ticks


def stat(html: str, slug: str) -> int:
    match = re.search(rf'stat-{slug}".*?class="stat-value">([\d,]+)<', html, re.S)
    assert match, f"no {slug} stat"
    return int(match.group(1).replace(",", ""))


def badge(html: str, slug: str) -> int:
    match = re.search(rf'href="/jobs/{slug}"[^>]*>.*?<span class="count">([\d,]+)</span>', html, re.S)
    assert match, f"no {slug} tab"
    return int(match.group(1).replace(",", ""))


def finish(deck, job_id: int, ok: bool) -> None:
    """One attempt of ``job_id`` through the real claim and ack."""
    now = deck.clock()
    assert [j.id for j in deck.store.claim("w1", now, limit=1)] == [job_id]
    if ok:
        deck.store.complete(job_id, "w1", now)
    else:
        deck.store.fail_many([Outcome(job_id, "w1", error="gateway timeout")], now)


# -- the overview's first view -------------------------------------------------------


def test_first_paint_after_a_quiet_spell_is_recounted(deck):
    client, ticks = cached_dash(deck, ttl=3.0)
    assert stat(client.get("/").get_data(as_text=True), "pending") == 0
    deck.enqueue("demo.noop", {})
    ticks.now += 3600  # nobody looked for an hour
    assert stat(client.get("/").get_data(as_text=True), "pending") == 1


def test_first_paint_within_the_ttl_is_served_from_the_cache(deck):
    client, ticks = cached_dash(deck, ttl=3.0)
    client.get("/")
    deck.enqueue("demo.noop", {})
    ticks.now += 2.9
    assert stat(client.get("/").get_data(as_text=True), "pending") == 0  # the cache still works


def test_a_poll_gets_a_stale_snapshot_only_while_polling_continues(deck):
    snaps = Snapshots(deck.store, ttl=3.0, monotonic=(ticks := Ticks()))
    snaps.get(deck.clock())
    deck.enqueue("demo.noop", {})
    ticks.now += 2 * 3.0  # two TTLs: no poll came in between
    assert snaps.get(deck.clock()).counts["pending"] == 1


# -- tab badges ------------------------------------------------------------------------


def test_tab_badges_are_counted_with_the_rows_they_head(deck):
    client, _ = cached_dash(deck, ttl=300.0)
    client.get("/")  # a snapshot with nothing in it, cached for five minutes
    job, _ = deck.enqueue("demo.noop", {})
    page = client.get("/jobs/pending").get_data(as_text=True)
    assert f'id="job-{job.id}"' in page and badge(page, "pending") == 1
    deck.enqueue("demo.noop", {})
    rows = client.get("/fragments/jobs/pending/rows", headers=HTMX).get_data(as_text=True)
    assert rows.count('class="row-select"') == 2 and badge(rows, "pending") == 2


# -- queue latency ---------------------------------------------------------------------

backends = pytest.mark.backends


@backends
def test_queue_latency_leaves_out_paused_queues(deck, clock):
    deck.enqueue("demo.send-email", {"user_id": "u1"}, queue="mail")
    deck.queues.set_paused("mail", True, clock.now, "alice")
    clock.advance(600)
    assert queue_latency(deck.store, clock.now) is None  # only paused jobs are due: nothing is late
    deck.enqueue("demo.noop", {})
    clock.advance(5)
    assert queue_latency(deck.store, clock.now) == pytest.approx(5.0)
    deck.queues.set_paused("mail", False, clock.now, "alice")
    assert queue_latency(deck.store, clock.now) == pytest.approx(605.0)


def test_queues_page_says_a_paused_queue_is_paused_on_its_row(dash, deck, clock):
    deck.enqueue("demo.send-email", {"user_id": "u1"}, queue="mail")
    deck.queues.set_paused("mail", True, clock.now, "alice")
    html = dash.get("/queues").get_data(as_text=True)
    mail = html[html.index('data-queue="mail"') :].split("</tr>")[0]
    assert "queue paused" in mail
    default = html[html.index('data-queue="default"') :].split("</tr>")[0] if 'data-queue="default"' in html else ""
    assert "queue paused" not in default


# -- the job page ---------------------------------------------------------------------


def test_a_completed_job_shows_its_earlier_error_as_history(dash, deck, clock):
    job, _ = deck.enqueue("demo.flaky", {"failures": 1}, max_retries=1)
    finish(deck, job.id, ok=False)
    clock.advance(60)
    finish(deck, job.id, ok=True)
    html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    live = html.split('id="job-live"')[1].split('id="job-edit"')[0]
    assert "Failed before succeeding:" in live and "gateway timeout" in live
    assert 'class="error-line"' not in live
    assert ">2/2 <" in live  # attempts made / allowed


def test_a_running_job_counts_its_running_attempt(dash, deck):
    job, _ = deck.enqueue("demo.noop", {}, max_retries=3)
    deck.store.claim("w1", deck.clock(), limit=1)
    html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert '<span class="muted attempt-count">1</span>' in html and "Attempt 1" in html
    assert ">1/4 <" in html


def test_the_breadcrumb_is_inside_the_polled_region(dash, deck, clock):
    job, _ = deck.enqueue("demo.noop", {})
    finish(deck, job.id, ok=True)
    fragment = dash.get(f"/fragments/jobs/{job.id}?status=pending&attempts=0", headers=HTMX).get_data(as_text=True)
    crumbs = fragment.split('class="crumbs"')[1].split("</div>")[0]
    assert 'href="/jobs/completed">Completed</a>' in crumbs and f"Job {job.id}" in crumbs
    assert 'id="job-result" hx-swap-oob="true"' in fragment and "No result yet" not in fragment


# -- the lists -------------------------------------------------------------------------


def test_the_attempts_column_shows_attempts_made_and_allowed(dash, deck):
    job, _ = deck.enqueue("demo.noop", {}, max_retries=3)
    finish(deck, job.id, ok=True)
    html = dash.get("/jobs/completed").get_data(as_text=True)
    row = html.split(f'id="job-{job.id}"')[1].split("</tr>")[0]
    assert re.search(r'class="num mono col-secondary attempts"[^>]*>1/4<', row)


@pytest.mark.parametrize(
    ("path", "made", "allowed"),
    [
        ("fresh", 0, 4),
        ("failed once", 1, 4),
        ("dead", 4, 4),
        ("dead, then retried by a person", 4, 8),
        ("discarded while waiting", 1, 4),
    ],
)
def test_attempts_allowed_follows_the_retry_budget(deck, clock, path, made, allowed):
    job, _ = deck.enqueue("demo.fail", {}, max_retries=3)
    failures = {"fresh": 0, "failed once": 1, "discarded while waiting": 1}.get(path, 4)
    for _ in range(failures):
        clock.advance(60)
        finish(deck, job.id, ok=False)
    if path == "dead, then retried by a person":
        deck.store.retry(job.id, clock.now)
    if path == "discarded while waiting":
        deck.store.discard(job.id, clock.now)
    record = deck.store.get(job.id)
    assert (record.attempt, attempts_allowed(record)) == (made, allowed)


def test_the_default_priority_has_no_label(dash, deck):
    plain, _ = deck.enqueue("demo.noop", {})
    urgent, _ = deck.enqueue("demo.noop", {}, priority="high")
    html = dash.get("/jobs/pending").get_data(as_text=True)
    rows = {i: html.split(f'id="job-{i}"')[1].split("</tr>")[0] for i in (plain.id, urgent.id)}
    assert '<span class="prio' not in rows[plain.id] and ">low<" not in rows[plain.id]
    assert 'class="prio prio-high"' in rows[urgent.id]


def test_the_type_filters_its_list_and_the_select_submits_on_change(dash, deck):
    job_id = make_dead(deck)
    html = dash.get("/jobs/dead").get_data(as_text=True)
    row = html.split(f'id="job-{job_id}"')[1].split("</tr>")[0]
    assert 'class="type-filter" href="/jobs/dead?type=demo.fail"' in row
    assert '<select name="type" aria-label="Type" data-submit-on-change>' in html


def test_run_now_and_retry_say_what_they_do(dash, deck):
    dead = make_dead(deck)
    later, _ = deck.enqueue("demo.noop", {}, delay_seconds=600)
    html = dash.get("/jobs/dead").get_data(as_text=True)
    retry = re.search(rf'id="job-{dead}".*?(<button[^>]*>Retry</button>)', html, re.S).group(1)
    assert 'title="Queue it again now with a fresh budget of 1 attempt;' in retry and "aria-description=" in retry
    html = dash.get("/jobs/scheduled").get_data(as_text=True)
    run = re.search(rf'id="job-{later.id}".*?(<button[^>]*>Run now</button>)', html, re.S).group(1)
    assert 'title="Start it as soon as a worker is free' in run and "aria-description=" in run


def test_times_carry_their_exact_value_for_the_switch(dash, deck, clock):
    job, _ = deck.enqueue("demo.noop", {})
    html = dash.get("/jobs/pending").get_data(as_text=True)
    row = html.split(f'id="job-{job.id}"')[1].split("</tr>")[0]
    stamp = clock.now.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'<time datetime="{clock.now.isoformat()}" title="{stamp}">now</time>' in row
    assert 'id="time-toggle"' in html and 'aria-pressed="false"' in html


# -- the overview's way into dead letter -------------------------------------------------


def test_overview_lists_dead_jobs_with_filter_and_fix_links_escaped(dash, deck):
    job, _ = deck.enqueue("demo.fail", {}, max_retries=0)
    now = deck.clock()
    deck.store.claim("w1", now, limit=1)
    deck.store.fail_many([Outcome(job.id, "w1", error='<img src=x onerror="alert(1)">\x00 declined')], now)
    html = dash.get("/").get_data(as_text=True)
    item = html.split(f'data-job="{job.id}"')[1].split("</li>")[0]
    assert 'href="/jobs/dead?type=demo.fail"' in item
    assert f'href="/jobs/{job.id}#job-edit">Fix payload' in item
    assert "<img" not in item and "&lt;img src=x" in item


def test_a_viewer_gets_no_fix_link_on_the_overview(deck):
    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    client.post("/login", data={"username": "victor", "password": "victor-secret", "csrf_token": token})
    job_id = make_dead(deck)
    html = client.get("/").get_data(as_text=True)
    assert f'data-job="{job_id}"' in html and "Fix payload" not in html
    assert "Fix payload" not in client.get("/jobs/dead").get_data(as_text=True)


def test_the_overview_lists_the_latest_dead_job_of_each_type(dash, deck):
    fails = [make_dead(deck) for _ in range(3)]
    flaky = make_dead(deck, "demo.flaky", {"failures": 9})
    html = dash.get("/").get_data(as_text=True)
    assert re.findall(r'class="dead-item" data-job="(\d+)"', html) == [str(flaky), str(fails[-1])]
    dead_list = dash.get("/jobs/dead").get_data(as_text=True)
    row = dead_list.split(f'id="job-{fails[0]}"')[1].split("</tr>")[0]
    assert f'href="/jobs/{fails[0]}#job-edit"' in row and "Fix payload…" in row


def test_dead_jobs_leave_the_overview_once_retried(dash, deck):
    job_id = make_dead(deck)
    deck.store.retry(job_id, deck.clock() + timedelta(seconds=1))
    assert f'data-job="{job_id}"' not in dash.get("/").get_data(as_text=True)
    assert deck.store.get(job_id).status is State.PENDING
