"""Hostile requests at "Cancel selected" (``/actions/selected/cancel``), the
one new input surface of the list fixes: ids that are no ids (NUL bytes,
beyond BIGINT, foreign digits, too many), a tab that does not exist, a
cross-site form post without the CSRF token. Each is refused with a clear
4xx and moves no job; never a 500."""

from __future__ import annotations

import pytest
from dashboard_support import HTMX
from dashboard_support import post as dash_post
from jobdeck.core.states import State
from jobdeck.web.dashboard.actions import MAX_SELECTED

CANCEL = "/actions/selected/cancel"
BEYOND = [str(2**63), str(2**64), "9" * 40]


@pytest.mark.backends
def test_ids_that_are_no_ids_are_refused_and_nothing_moves(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    for bad in [f"{job.id}\x00", "\x00", "²", "-1", "0", "1e3", " ", *BEYOND]:
        r = dash_post(dash, CANCEL, {"tab": "pending", "ids": [str(job.id), bad]})
        assert r.status_code == 422 and "ids" in r.get_data(as_text=True), repr(bad)
    assert deck.store.get(job.id).status is State.PENDING


def test_too_many_ids_and_an_unknown_tab_are_refused(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    many = [str(i) for i in range(1, MAX_SELECTED + 2)]
    r = dash_post(dash, CANCEL, {"tab": "pending", "ids": many})
    assert r.status_code == 422 and f"At most {MAX_SELECTED}" in r.get_data(as_text=True)
    assert dash_post(dash, CANCEL, {"tab": "<script>", "ids": [str(job.id)]}).status_code == 404
    assert dash_post(dash, CANCEL, {"tab": "pending\x00", "ids": [str(job.id)]}).status_code == 404
    assert deck.store.get(job.id).status is State.PENDING


def test_a_cross_site_form_post_is_refused(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    dash.get("/jobs/pending")  # the victim's session cookie is set
    headers = {**HTMX, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    r = dash.post(CANCEL, data={"tab": "pending", "ids": [str(job.id)]}, headers=headers)
    assert r.status_code == 400
    assert deck.store.get(job.id).status is State.PENDING
