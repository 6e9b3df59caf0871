"""Every dashboard page and fragment renders from the real store."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from dashboard_support import HTMX, make_dead
from jobdeck.core.states import State
from jobdeck.web.dashboard.tabs import TABS


def test_overview_counts_every_state_and_links_to_it(dash, deck):
    deck.enqueue("demo.noop", {})
    deck.enqueue("demo.noop", {}, delay_seconds=600)
    make_dead(deck)
    html = dash.get("/").get_data(as_text=True)
    for tab in TABS:
        assert f'href="/jobs/{tab.slug}"' in html
        assert tab.label in html
    assert "1 new job in dead letter" in html
    assert "Throughput" in html and "<svg" in html and "Queue latency" in html


def test_overview_fragment_polls_without_the_layout(dash):
    r = dash.get("/fragments/overview", headers=HTMX)
    html = r.get_data(as_text=True)
    assert r.status_code == 200
    assert html.lstrip().startswith('<div id="overview-live"')
    assert 'hx-trigger="jd-poll from:body"' in html
    assert "<html" not in html


def test_dead_banner_counts_only_jobs_since_the_operator_looked(dash, deck, clock):
    make_dead(deck)
    dash.get("/jobs/dead")  # marks dead letter as seen
    assert "in dead letter" not in dash.get("/").get_data(as_text=True)
    clock.advance(5)
    make_dead(deck)
    assert "1 new job in dead letter" in dash.get("/").get_data(as_text=True)


@pytest.mark.parametrize("tab", [t.slug for t in TABS])
def test_each_tab_lists_its_jobs(dash, deck, clock, tab):
    due, _ = deck.enqueue("demo.noop", {"which": "due"})
    later, _ = deck.enqueue("demo.noop", {"which": "later"}, delay_seconds=600)
    dead = make_dead(deck)
    html = dash.get(f"/jobs/{tab}").get_data(as_text=True)
    expected = {"pending": due.id, "scheduled": later.id, "dead": dead}.get(tab)
    rows = [i for i in (due.id, later.id, dead) if f'id="job-{i}"' in html]
    assert rows == ([expected] if expected else [])


def test_list_columns_fit_the_state(dash, deck):
    make_dead(deck)
    html = dash.get("/jobs/dead").get_data(as_text=True)
    assert "Latest error" in html and "boom" in html and "second line" not in html
    assert ">Retry</button>" in html and ">Discard</button>" in html
    html = dash.get("/jobs/running").get_data(as_text=True)
    assert "Progress" in html and "Worker" in html


def test_buttons_follow_the_state_machine(dash, deck):
    deck.enqueue("demo.noop", {}, delay_seconds=60)
    html = dash.get("/jobs/scheduled").get_data(as_text=True)
    assert ">Run now</button>" in html and ">Discard</button>" in html and ">Retry</button>" not in html
    job, _ = deck.enqueue("demo.noop", {})
    deck.store.claim("w", deck.clock())
    html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    head = html.split('id="job-live"')[1].split('<dl class="fields">')[0]
    assert re.findall(r'hx-post="([^"]+)"', head) == [f"/actions/jobs/{job.id}/cancel"]  # running: only cancel


def test_filters_search_and_keyset_pages(dash, deck):
    ids = deck.enqueue_many([{"type": "demo.noop", "payload": {"n": i}} for i in range(60)])
    deck.enqueue("demo.sleep", {"needle": "haystack-42"})
    html = dash.get("/jobs/pending?type=demo.noop").get_data(as_text=True)
    assert html.count('class="row-select"') == 50
    assert f"before={ids[10]}" in html  # older page starts below the 50th newest
    older = dash.get(f"/jobs/pending?type=demo.noop&before={ids[10]}").get_data(as_text=True)
    assert older.count('class="row-select"') == 10 and "after=" in older
    found = dash.get("/jobs/pending?q=haystack-42").get_data(as_text=True)
    assert found.count('class="row-select"') == 1 and "demo.sleep" in found
    none = dash.get("/jobs/pending?queue=nope").get_data(as_text=True)
    assert "No pending jobs match this filter." in none


def test_rows_fragment_is_the_body_plus_tabs_and_pager_out_of_band(dash, deck):
    deck.enqueue("demo.noop", {})
    html = dash.get("/fragments/jobs/pending/rows?type=demo.noop", headers=HTMX).get_data(as_text=True)
    assert html.lstrip().startswith('<tbody id="job-rows"')
    assert 'id="tabs" class="tabs" aria-label="Job states" hx-swap-oob="true"' in html
    assert 'id="pager"' in html and "type=demo.noop" in html


def test_unknown_tab_and_job_are_404_pages(dash):
    assert dash.get("/jobs/nonsense").status_code == 404
    r = dash.get("/jobs/999")
    assert r.status_code == 404 and "job 999 does not exist" in r.get_data(as_text=True)


def test_job_page_shows_fields_payload_and_timeline(dash, deck):
    job_id = make_dead(deck, payload={"html": "<script>alert(1)</script>", "n": 1})
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Attempt 1" in html and '<details class="traceback">' in html and "Traceback: boom" in html
    assert "Edit payload and retry" in html


def test_job_live_fragment_sends_timeline_only_when_changed(dash, deck):
    job, _ = deck.enqueue("demo.noop", {})
    first = dash.get(f"/fragments/jobs/{job.id}?status=pending&attempts=0", headers=HTMX).get_data(as_text=True)
    assert 'id="job-live"' in first and "job-timeline" not in first
    deck.store.claim("w", deck.clock())
    deck.store.set_progress(job.id, 1, "w", 0.4, "rendered 400 of 1000 rows", deck.clock())
    moved = dash.get(f"/fragments/jobs/{job.id}?status=pending&attempts=0", headers=HTMX).get_data(as_text=True)
    assert 'id="job-timeline" hx-swap-oob="true"' in moved
    assert 'value="0.4"' in moved and "rendered 400 of 1000 rows" in moved and "40%" in moved


def test_running_list_shows_progress(dash, deck):
    job, _ = deck.enqueue("demo.report", {})
    deck.store.claim("w", deck.clock())
    deck.store.set_progress(job.id, 1, "w", 0.25, "wrote 25 of 100 rows", deck.clock())
    html = dash.get("/jobs/running").get_data(as_text=True)
    assert "<progress" in html and "wrote 25 of 100 rows" in html


def test_finished_job_page_stops_polling(dash, deck):
    job_id = make_dead(deck)
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert 'id="job-live" class="card job-live">' in html  # no hx-trigger: polling stopped


def test_workers_page_lists_live_workers_and_their_jobs(dash, deck):
    deck.store.register_worker("host:1:abc", "host", 1, 4, deck.clock())
    job, _ = deck.enqueue("demo.sleep", {})
    deck.store.claim("host:1:abc", deck.clock())
    html = dash.get("/workers").get_data(as_text=True)
    assert "host:1:abc" in html and f'/jobs/{job.id}"' in html
    assert dash.get("/fragments/workers", headers=HTMX).status_code == 200
    deck.store.stop_worker("host:1:abc", deck.clock() + timedelta(seconds=1))
    assert 'aria-label="Stopped workers"' in dash.get("/workers").get_data(as_text=True)


def test_gone_workers_are_shown_apart_and_not_counted_live(dash, deck, clock):
    from jobdeck.maintenance.upkeep import Maintenance

    deck.store.register_worker("host:2:gone", "host", 2, 4, clock.now)
    job, _ = deck.enqueue("demo.sleep", {})
    deck.store.claim("host:2:gone", clock.now)
    clock.advance(seconds=deck.config.stall_timeout + 5)
    deck.store.register_worker("host:3:live", "host", 3, 4, clock.now)
    deck.store.heartbeat(job.id, "host:2:gone", clock.now)  # the job is not stalled yet, its worker is silent
    Maintenance(deck.store, deck.clock, deck.config.stall_timeout).sweep_once(clock.now)
    html = dash.get("/workers").get_data(as_text=True)
    assert html.index("host:3:live") < html.index("host:2:gone")  # live first
    gone_row = html[html.index('data-worker="host:2:gone"') :]
    assert "gone since" in gone_row.split("</tr>")[0] and f'/jobs/{job.id}"' in gone_row.split("</tr>")[0]
    overview = dash.get("/").get_data(as_text=True)
    assert "1 live" in overview and "1 gone" in overview and "host:2:gone" not in overview


def test_audit_page_empty_and_paged(dash):
    assert "No operator actions yet." in dash.get("/audit").get_data(as_text=True)


def test_confirmation_counts_exactly_what_matches(dash, deck):
    for _ in range(3):
        make_dead(deck, payload={"tag": "a"})
    make_dead(deck, payload={"tag": "b"})
    html = dash.get('/jobs/dead/confirm/retry?q="tag":"a"', headers=HTMX).get_data(as_text=True)
    assert "Retry all 3 matching" in html
    refused = dash.get("/jobs/completed/confirm/retry", headers=HTMX)
    assert refused.status_code == 409


def test_security_headers_on_pages(dash):
    r = dash.get("/")
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "style=" not in r.get_data(as_text=True)
    assert "<script>" not in r.get_data(as_text=True)


def test_dashboard_config_is_validated(make_config, registry):
    from jobdeck import create_app
    from jobdeck.core.config import ConfigError
    from jobdeck.deck import Jobdeck

    for bad, message in [({"poll_seconds": 0}, "dashboard.poll_seconds"), ({"poll_seconds": "3"}, "expected a number"),
                         ({"pol_seconds": 3}, "dashboard.pol_seconds: unknown")]:  # fmt: skip
        deck = Jobdeck(make_config(dashboard=bad), registry)
        try:
            with pytest.raises(ConfigError, match=message):
                create_app(deck=deck)
        finally:
            deck.store.engine.dispose()


def test_state_labels_come_from_the_state_enum():
    assert {t.state for t in TABS} == set(State)


def test_every_nav_entry_is_a_page_the_app_serves(dash):
    """The navigation lists ``NAV`` as it is (no entry is hidden for want of
    its page), so each entry's endpoint must be registered and render."""
    from jobdeck.web.dashboard import NAV

    html = dash.get("/").get_data(as_text=True)
    for endpoint, label, _ in NAV:
        assert endpoint in dash.application.view_functions, endpoint
        assert f">{label}<" in html, label
