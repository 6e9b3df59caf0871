"""The errors page: groups of dead (or failed) jobs with their counts,
times and sample, and "Retry/Discard all N in this group" running through
the same confirmation, batches, progress and audit as "all matching"."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from dashboard_support import make_dash_app, post
from jobdeck.core.states import State
from jobdeck.store import Outcome
from jobdeck.store.audit import list_audit
from test_error_groups import fail_jobs

from tests.helpers import password_hash

pytestmark = pytest.mark.backends

KEYS = "KeyError: '?'"


def _groups(deck):
    keys = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'", "KeyError: 'user_9'"])
    cards = fail_jobs(deck, "demo.fail", ["RuntimeError: card 4242 declined"])
    return keys, cards


def test_the_overview_links_to_the_errors_page_which_lists_the_groups(dash, deck):
    keys, cards = _groups(deck)
    overview = dash.get("/").get_data(as_text=True)
    assert 'href="/errors"' in overview
    assert dash.get("/errors").headers["Location"].endswith("/errors/dead")
    page = dash.get("/errors/dead").get_data(as_text=True)
    text = htmllib.unescape(page)
    assert text.index(KEYS) < text.index("RuntimeError: card ? declined")  # largest first
    assert "Retry all 3 in this group" in text and "Discard all 3 in this group" in text
    assert "Retry all 1 in this group" in text
    assert f'href="/jobs/{keys[-1]}"' in page and "KeyError: 'user_9'" in text  # the newest as sample
    assert "First seen" in text and "last seen" in text
    view = re.search(r'href="(/jobs/dead\?[^"]*error=[^"]*)"', page).group(1)
    listed = dash.get(htmllib.unescape(view)).get_data(as_text=True)
    assert all(f"/jobs/{i}" in listed for i in keys) and f"/jobs/{cards[0]}" not in listed


def test_the_failed_view_and_an_empty_one(dash, deck):
    [retrying] = fail_jobs(deck, "demo.fail", ["OSError: disk 3 full"], retryable=True)
    assert "nothing waits for a person" in dash.get("/errors/dead").get_data(as_text=True)
    failed = htmllib.unescape(dash.get("/errors/failed").get_data(as_text=True))
    assert "OSError: disk ? full" in failed and f"/jobs/{retrying}" in failed
    assert dash.get("/errors/pending").status_code == 404
    assert dash.get("/fragments/errors/failed").get_data(as_text=True).startswith('<section id="error-groups"')


def test_retry_all_in_a_group_confirms_batches_audits_and_leaves_the_other_group(dash, deck):
    keys, cards = _groups(deck)
    page = dash.get("/errors/dead").get_data(as_text=True)
    confirm_url = htmllib.unescape(re.search(r'hx-get="(/jobs/dead/confirm/retry\?[^"]*)"', page).group(1))
    confirm = htmllib.unescape(dash.get(confirm_url).get_data(as_text=True))
    assert "Retry all 3 matching" in confirm and f"error={KEYS}" in confirm
    vals = json.loads(re.search(r"hx-vals='([^']+)'", confirm).group(1))
    done = post(dash, "/actions/matching/retry", vals)
    assert "3 of 3 retried" in done.get_data(as_text=True) and done.headers["HX-Trigger"] == "jd-poll"
    assert [deck.store.get(i).status for i in keys] == [State.PENDING] * 3
    assert deck.store.get(cards[0]).status is State.DEAD
    [entry] = list_audit(deck.store)[0]
    assert (entry.action, entry.count) == ("retry all", 3) and f"error={KEYS}" in entry.detail
    after = htmllib.unescape(dash.get("/fragments/errors/dead").get_data(as_text=True))
    assert KEYS not in after and "Retry all 1 in this group" in after


def test_first_seen_survives_a_retry_all_that_fails_the_same_way(dash, deck, clock):
    t0 = clock()
    keys, _ = _groups(deck)
    clock.advance(240)
    vals = {"tab": "dead", "type": "demo.fail", "error": KEYS, "up_to": max(keys), "total": 3, "done": 0}
    assert "3 of 3 retried" in post(dash, "/actions/matching/retry", vals).get_data(as_text=True)
    now = clock()
    claimed = deck.store.claim("w2", now, limit=3)
    deck.store.fail_many(
        [Outcome(j.id, "w2", attempt=j.attempt, error="KeyError: 'user_1'", retryable=False) for j in claimed], now
    )
    page = htmllib.unescape(dash.get("/errors/dead").get_data(as_text=True))
    card = page[page.index(KEYS) :]
    seen = re.search(r'First seen <span title="([^"]+)">([^<]+)</span> · last seen <span title="[^"]+">([^<]+)<', card)
    assert seen.groups() == (t0.strftime("%Y-%m-%d %H:%M:%S UTC"), "4 min 0 s ago", "now")


def test_discard_all_in_a_group(dash, deck):
    keys, cards = _groups(deck)
    vals = {"tab": "dead", "type": "demo.fail", "error": KEYS, "up_to": cards[0], "total": 3, "done": 0}
    post(dash, "/actions/matching/discard", vals)
    assert [deck.store.get(i).status for i in keys] == [State.DISCARDED] * 3
    assert deck.store.get(cards[0]).status is State.DEAD


def test_messages_and_fingerprints_are_escaped(dash, deck):
    [job] = fail_jobs(deck, "demo.fail", ["RuntimeError: <img src=x onerror=alert(1)> 'q'"])
    page = dash.get("/errors/dead").get_data(as_text=True)
    assert "<img" not in page and "&lt;img src=x onerror=alert(?)&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # the sample error, as recorded


def test_a_hostile_group_filter_is_refused_with_a_message(dash, deck):
    _groups(deck)
    assert dash.get("/jobs/dead?error=a%00b").status_code == 422
    assert dash.get("/jobs/dead?error=" + "x" * 300).status_code == 422
    r = post(dash, "/actions/matching/retry", {"tab": "dead", "error": "a\x00b", "up_to": 10})
    assert r.status_code == 422
    assert deck.store.counts(deck.clock())["dead"] == 4


def test_viewers_see_no_group_buttons_and_cannot_act(make_deck, clock):
    deck = make_deck(clock)
    keys, _ = _groups(deck)
    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    login = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', login).group(1)
    client.post("/login", data={"username": "victor", "password": "victor-secret", "csrf_token": token})
    page = htmllib.unescape(client.get("/errors/dead").get_data(as_text=True))
    assert KEYS in page and "in this group" not in page
    vals = {"tab": "dead", "type": "demo.fail", "error": KEYS, "up_to": keys[-1]}
    r = post(client, "/actions/matching/retry", vals)
    assert r.status_code == 403
    assert [deck.store.get(i).status for i in keys] == [State.DEAD] * 3


def test_a_group_action_without_the_csrf_token_is_refused(dash, deck):
    keys, _ = _groups(deck)
    vals = {"tab": "dead", "type": "demo.fail", "error": KEYS, "up_to": keys[-1]}
    assert post(dash, "/actions/matching/retry", vals, token=False).status_code == 400
    assert post(dash, "/actions/matching/retry", vals, htmx=False, token=False).status_code == 400
    assert [deck.store.get(i).status for i in keys] == [State.DEAD] * 3
    assert list_audit(deck.store)[0] == []


def test_jobs_failed_without_a_fingerprint_are_listed_but_offer_no_group_action(dash, deck):
    """A group with no fingerprint (failed under the previous release) has no
    filter that names only it, so it offers its type's list instead."""
    from jobdeck.store.models import jobs
    from sqlalchemy import update

    ids = fail_jobs(deck, "demo.fail", ["KeyError: 'a'", "OSError: b"])
    with deck.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(error_fingerprint=None))
    page = htmllib.unescape(dash.get("/errors/dead").get_data(as_text=True))
    assert "No fingerprint" in page and "in this group" not in page
    assert "View dead letter demo.fail jobs" in page
