"""Job logs on the job page: each attempt's lines, escaped; the running
attempt's poller answers only the new lines and itself again, and stops
once the attempt ended; the status poll brings the log along when the job
changes state (pending -> running puts the poller on the page)."""

from __future__ import annotations

import re

import pytest
from jobdeck.deck import Jobdeck
from jobdeck.jobs.joblogs import LogLimits, LogLine
from jobdeck.store import Outcome
from jobdeck.store.joblogs import append_lines, lines_of

pytestmark = pytest.mark.backends

POLL = re.compile(r'<li class="log-poll"[^>]*hx-get="([^"]+)"')


def _log(deck: Jobdeck, job_id: int, attempt: int, *messages: str, level: str = "info") -> None:
    lines = [LogLine(level, m, deck.clock()) for m in messages]
    append_lines(deck.store, job_id, attempt, lines, 0, LogLimits(max_lines_per_attempt=3))


def _running(deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop", {}, max_retries=3)
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1, types=["demo.noop"])
    assert claimed.id == job.id
    return job.id


def test_the_page_shows_each_attempts_log_escaped(dash, deck) -> None:
    job_id = _running(deck)
    _log(deck, job_id, 1, "<script>alert(1)</script>", "tab\there & \x1b[31mred\x1b[0m", level="warning")
    deck.store.fail_many([Outcome(job_id, "w1", attempt=1, error="boom")], deck.clock())
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert 'id="job-logs-card"' in html and "Attempt 1" in html
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "tab\there &amp; \x1b[31mred" in html
    assert not POLL.search(html)  # the attempt ended: nothing polls
    assert 'class="log-line log-warning"' in html


def test_a_job_that_never_logged_has_no_log_card(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop", {})
    assert 'id="job-logs-card"' not in dash.get(f"/jobs/{job.id}").get_data(as_text=True)


def test_the_running_attempt_polls_only_its_new_lines_and_stops_at_its_end(dash, deck) -> None:
    job_id = _running(deck)
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "Nothing logged yet." in html
    url = POLL.search(html).group(1).replace("&amp;", "&")
    assert "attempt=1" in url and "after=0" in url

    _log(deck, job_id, 1, "first", "second")
    more = dash.get(url).get_data(as_text=True)
    assert more.count('class="log-line') == 2 and "first" in more and "second" in more
    url = POLL.search(more).group(1).replace("&amp;", "&")
    last = lines_of(deck.store, job_id)[-1].id
    assert f"after={last}" in url

    nothing = dash.get(url).get_data(as_text=True)  # no new line: the poller alone
    assert "log-line" not in nothing and POLL.search(nothing)

    _log(deck, job_id, 1, "third")
    deck.store.complete_many([Outcome(job_id, "w1", attempt=1)], deck.clock())
    final = dash.get(url).get_data(as_text=True)
    assert "third" in final and "first" not in final
    assert not POLL.search(final)  # done: the polling stops


def test_the_status_poll_brings_the_log_when_the_job_starts(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop", {})
    html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert not POLL.search(html)
    deck.store.claim("w1", deck.clock(), limit=1, types=["demo.noop"])
    live = dash.get(f"/fragments/jobs/{job.id}?status=pending&attempts=0").get_data(as_text=True)
    assert 'id="job-logs" hx-swap-oob="true"' in live and POLL.search(live)


def test_the_poll_fragment_refuses_bad_arguments(dash, deck) -> None:
    job_id = _running(deck)
    assert dash.get(f"/fragments/jobs/{job_id}/logs?attempt=x&after=0").status_code == 400
    assert dash.get(f"/fragments/jobs/{job_id}/logs?attempt=1&after=-3").status_code == 400
    assert dash.get(f"/fragments/jobs/{job_id}/logs?attempt=1").status_code == 400
    assert dash.get("/fragments/jobs/999999/logs?attempt=1&after=0").status_code == 404


def test_the_log_and_its_poll_need_a_login(deck) -> None:
    from dashboard_support import make_dash_app

    from tests.helpers import password_hash

    users = {"vera": {"password_hash": password_hash("vera-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    job_id = _running(deck)
    _log(deck, job_id, 1, "secret line")
    for url in (f"/jobs/{job_id}", f"/fragments/jobs/{job_id}/logs?attempt=1&after=0"):
        r = client.get(url)
        assert r.status_code == 302 and "/login?next=" in r.headers["Location"]
        assert "secret line" not in r.get_data(as_text=True)
