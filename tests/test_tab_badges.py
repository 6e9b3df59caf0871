"""The job lists' tab badges: each counts the jobs its tab lists under the
list's filter, among the newest ``BADGE_WINDOW`` jobs of its state, so a
list view never scans every job (``jobdeck.store.reads.badge_counts``). Exact
where a state holds fewer; a lower bound, shown "N+", where it holds more;
the open tab's badge agrees with the rows under it. On both databases."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from dashboard_support import make_dash_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter, Outcome
from jobdeck.store.models import attempts, jobs
from jobdeck.store.reads import Badge, badge_counts
from jobdeck.web.dashboard import views
from sqlalchemy import delete, event

pytestmark = pytest.mark.backends

NOOP, REPORT = "demo.noop", "demo.report"
KINDS = ("due", "scheduled", "completed", "dead")


def make(deck: Jobdeck, kind: str, job_type: str = NOOP, payload: dict[str, Any] | None = None) -> int:
    """One job of ``kind`` through the real enqueue, claim and acknowledgement."""
    now = deck.clock()
    run_at = now + timedelta(hours=1) if kind == "scheduled" else None
    job, _ = deck.enqueue(job_type, payload or {}, run_at=run_at, max_retries=0)
    if kind in ("completed", "dead"):
        with deck.store.write() as conn:
            assert [j.id for j in deck.store.claim_ids(conn, "w1", now, [job.id])] == [job.id]
        if kind == "completed":
            deck.store.complete(job.id, "w1", now)
        else:
            deck.store.fail_many([Outcome(job.id, "w1", error="boom")], now)
    return job.id


def shown(deck: Jobdeck, f: JobFilter) -> dict[str, int]:
    """What each tab lists under ``f``: its rows, all of them."""
    now = deck.clock()
    out = {}
    for slug, state, scheduled in [("pending", State.PENDING, False), ("scheduled", State.PENDING, True),
                                   ("completed", State.COMPLETED, None), ("dead", State.DEAD, None)]:  # fmt: skip
        out[slug] = len(
            deck.store.list_jobs(JobFilter(status=state, scheduled=scheduled, type=f.type, limit=10_000), now)
        )
    return out


def test_below_the_window_every_badge_is_exact_and_equals_the_counts(deck: Jobdeck) -> None:
    for kind in KINDS:
        for _ in range(2):
            make(deck, kind)
    badges = badge_counts(deck.store, JobFilter(), deck.clock(), window=10)
    counts = deck.store.counts(deck.clock())
    assert {slug: b for slug, b in badges.items() if b.n} == {slug: Badge(n, True) for slug, n in counts.items() if n}
    assert all(b.exact for b in badges.values())


def test_past_the_window_a_badge_is_a_lower_bound(deck: Jobdeck) -> None:
    for _ in range(3):
        make(deck, "scheduled")
    for _ in range(5):
        make(deck, "due")
    for _ in range(4):
        make(deck, "completed")
    badges = badge_counts(deck.store, JobFilter(), deck.clock(), window=4)
    # Pending holds 8: its newest 4 are all due, so Scheduled reads "0+".
    assert badges["pending"] == Badge(4, False)
    assert badges["scheduled"] == Badge(0, False)
    # Exactly 4 completed: the window is full, so it cannot tell there are no more.
    assert badges["completed"] == Badge(4, False)
    assert badges["dead"] == Badge(0, True)


def test_a_filter_counts_its_jobs_among_the_newest_of_each_state(deck: Jobdeck) -> None:
    for job_type in (REPORT, REPORT, NOOP, NOOP, NOOP, REPORT):
        make(deck, "completed", job_type)
    make(deck, "dead", REPORT)
    badges = badge_counts(deck.store, JobFilter(type=REPORT), deck.clock(), window=3)
    assert badges["completed"] == Badge(1, False)  # the newest 3 completed: NOOP, NOOP, REPORT
    assert badges["dead"] == Badge(1, True)
    assert badge_counts(deck.store, JobFilter(type=REPORT), deck.clock(), window=7)["completed"] == Badge(3, True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    made=st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from([NOOP, REPORT])), max_size=14),
    window=st.integers(1, 8),
    by_type=st.sampled_from([None, NOOP, REPORT]),
)
def test_a_badge_is_exact_or_a_true_lower_bound(deck: Jobdeck, made: list[tuple[str, str]], window: int,
                                                by_type: str | None) -> None:  # fmt: skip
    with deck.store.write() as conn:
        conn.execute(delete(attempts))
        conn.execute(delete(jobs))
    for kind, job_type in made:
        make(deck, kind, job_type)
    f = JobFilter(type=by_type)
    truth = shown(deck, f)
    held = deck.store.counts(deck.clock())
    for slug, badge in badge_counts(deck.store, f, deck.clock(), window=window).items():
        if slug not in truth:
            assert badge == Badge(0, True), slug
            continue
        in_state = held["pending"] + held["scheduled"] if slug in ("pending", "scheduled") else held[slug]
        assert badge.n <= truth[slug], (slug, badge, truth)
        assert badge.exact == (in_state < window), (slug, badge, in_state)
        if badge.exact:
            assert badge.n == truth[slug], (slug, badge, truth)


# -- on the page -------------------------------------------------------------------------


def tab(page: str, label: str) -> tuple[str, str | None]:
    """A tab's badge text as shown, and its title if it has one."""
    m = re.search(rf'</span>{label} <span class="count"(?: title="([^"]*)")?>([^<]*)</span>', page)
    assert m, f"no {label} tab"
    return m.group(2), m.group(1)


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "BADGE_WINDOW", 3)


@pytest.mark.usefixtures("small_window")
def test_a_state_past_the_window_shows_a_plus_and_says_why(deck: Jobdeck) -> None:
    for _ in range(5):
        make(deck, "completed")
    make(deck, "dead")
    page = make_dash_app(deck).test_client().get("/jobs/dead").get_data(as_text=True)
    assert tab(page, "Completed") == ("3+", "At least 3: counted among the newest 3 completed jobs")
    assert tab(page, "Dead letter") == ("1", None)


@pytest.mark.usefixtures("small_window")
def test_pending_and_scheduled_share_one_window_and_say_so(deck: Jobdeck) -> None:
    # Newer scheduled jobs fill the pending state's window: the due tab reads
    # "0+" over its 2 jobs, and its tooltip must say what was looked through.
    for kind in ("due", "due", "scheduled", "scheduled", "scheduled"):
        make(deck, kind)
    page = make_dash_app(deck).test_client().get("/jobs/dead").get_data(as_text=True)
    assert tab(page, "Pending") == ("0+", "At least 0: counted among the newest 3 pending and scheduled jobs")
    assert tab(page, "Scheduled") == ("3+", "At least 3: counted among the newest 3 pending and scheduled jobs")
    page = make_dash_app(deck).test_client().get("/jobs/pending").get_data(as_text=True)
    assert tab(page, "Pending") == ("2", None)  # the open tab: its whole list


@pytest.mark.usefixtures("small_window")
def test_the_open_tab_counts_its_rows_when_they_are_the_whole_list(deck: Jobdeck) -> None:
    # The two matches are older than the newest 3 dead jobs: the window alone
    # would say "0+" over two rows. The page holds the whole list, so it is 2.
    for i in range(6):
        make(deck, "dead", payload={"note": "needle" if i < 2 else "hay"})
    dash = make_dash_app(deck).test_client()
    page = dash.get("/jobs/dead", query_string={"q": "needle"}).get_data(as_text=True)
    assert len(re.findall(r'<tr id="job-\d+"', page)) == 2
    assert tab(page, "Dead letter") == ("2", None)
    poll = dash.get("/fragments/jobs/dead/rows", query_string={"q": "needle"}, headers={"HX-Request": "true"})
    assert tab(poll.get_data(as_text=True), "Dead letter") == ("2", None)


@pytest.mark.usefixtures("small_window")
def test_a_page_with_older_rows_raises_the_lower_bound_to_what_it_shows(deck: Jobdeck, monkeypatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 4)
    for _ in range(6):
        make(deck, "dead")
    page = make_dash_app(deck).test_client().get("/jobs/dead").get_data(as_text=True)
    assert len(re.findall(r'<tr id="job-\d+"', page)) == 4
    assert tab(page, "Dead letter")[0] == "5+"  # 4 shown and an older page


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("f", [JobFilter(type=REPORT), JobFilter(queue="default"), JobFilter(search="needle")])
def test_each_filtered_count_walks_its_states_window_not_the_filters_index(deck: Jobdeck, f: JobFilter) -> None:
    """Without statistics SQLite took (type, id) for a type's count past the
    window's lowest id: every newer job of the type, not the window's rows
    (60 ms instead of 15 at 1M jobs). Each count is held to (status, id)."""
    for kind in KINDS:
        make(deck, kind, REPORT)
    seen: list[tuple[str, Any]] = []

    def grab(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.startswith("SELECT count(*)") and "FROM jobs" in statement:
            seen.append((statement, parameters))

    event.listen(deck.store.engine, "before_cursor_execute", grab)
    try:
        badge_counts(deck.store, f, deck.clock(), window=1)
    finally:
        event.remove(deck.store.engine, "before_cursor_execute", grab)
    assert len(seen) >= len(State), seen
    with deck.store.engine.connect() as conn:
        for statement, parameters in seen:
            plan = " ".join(str(row) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters))
            assert "ix_jobs_status_id" in plan, (statement, plan)
