"""What a tester found on the job lists and the overview (issue 11 follow-up),
through the test client: the tab badges of a filtered list count the
filtered jobs; the overview's dead-letter card shows the job of each type
that died last; Discard and Cancel… say what they do; the rows of every
cancellable tab can be cancelled together (operators only, audited); the
error-group filter survives the Filter form and can be removed."""

from __future__ import annotations

import html
import re

from dashboard_support import make_dash_app, make_dead, post
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.audit import list_audit

from tests.helpers import password_hash

REPORT = "demo.report"


def _finished(deck: Jobdeck, job_type: str, n: int = 1) -> list[int]:
    """``n`` jobs of ``job_type`` run and completed through the real claim."""
    ids = [deck.enqueue(job_type, {"n": i})[0].id for i in range(n)]
    claimed = deck.store.claim("w1", deck.clock(), limit=n, types=[job_type])
    assert sorted(j.id for j in claimed) == sorted(ids)
    for job_id in ids:
        deck.store.complete(job_id, "w1", deck.clock())
    return ids


def _running(deck: Jobdeck) -> int:
    job, _ = deck.enqueue("demo.noop")
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1, types=["demo.noop"])
    assert claimed.id == job.id
    return job.id


def _badges(page: str) -> dict[str, int]:
    """Each tab's badge as the page shows it, by tab label."""
    found = re.findall(
        r'<span class="dot dot-[a-z]+" aria-hidden="true"></span>([^<]+?) <span class="count">([\d,]+)</span>', page
    )
    return {label: int(n.replace(",", "")) for label, n in found}


def _rows(page: str) -> int:
    return len(re.findall(r'<tr id="job-\d+"', page))


# -- 1. tab badges under a filter ------------------------------------------------------


def test_a_filtered_lists_badges_count_the_filtered_jobs(dash, deck) -> None:
    for _ in range(2):
        make_dead(deck)
    _finished(deck, "demo.noop", 3)
    _finished(deck, REPORT, 1)
    page = dash.get("/jobs/dead", query_string={"type": REPORT}).get_data(as_text=True)
    badges = _badges(page)
    assert (badges["Dead letter"], _rows(page)) == (0, 0)
    assert badges["Completed"] == 1 and badges["Pending"] == 0
    page = dash.get("/jobs/completed", query_string={"type": REPORT}).get_data(as_text=True)
    assert _badges(page)["Completed"] == _rows(page) == 1


def test_an_unfiltered_lists_badges_count_every_job(dash, deck) -> None:
    make_dead(deck)
    _finished(deck, "demo.noop", 3)
    _finished(deck, REPORT, 1)
    badges = _badges(dash.get("/jobs/completed").get_data(as_text=True))
    assert (badges["Completed"], badges["Dead letter"]) == (4, 1)


def test_the_polled_rows_carry_the_filtered_badges(dash, deck) -> None:
    make_dead(deck)
    make_dead(deck, "demo.noop")
    poll = dash.get("/fragments/jobs/dead/rows", query_string={"type": "demo.fail"}, headers={"HX-Request": "true"})
    badges = _badges(poll.get_data(as_text=True))
    assert badges["Dead letter"] == 1 and _rows(poll.get_data(as_text=True)) == 1


def test_an_error_group_lists_badges_count_only_that_group(dash, deck) -> None:
    make_dead(deck)
    from jobdeck.core.fingerprint import fingerprint

    fp = fingerprint("boom\nsecond line")
    _finished(deck, "demo.fail", 2)
    page = dash.get("/jobs/dead", query_string={"type": "demo.fail", "error": fp}).get_data(as_text=True)
    badges = _badges(page)
    assert (badges["Dead letter"], badges["Completed"], _rows(page)) == (1, 0, 1)


# -- 2. the overview's dead letter card ------------------------------------------------


def test_the_overview_shows_the_job_of_each_type_that_died_last(dash, deck, clock) -> None:
    older, _ = deck.enqueue("demo.fail", {}, max_retries=0)
    newer, _ = deck.enqueue("demo.fail", {}, max_retries=0)
    claimed = deck.store.claim("w1", clock(), limit=2, types=["demo.fail"])
    assert len(claimed) == 2
    deck.store.fail_many([Outcome(newer.id, "w1", error="first to die")], clock())
    clock.advance(120)
    deck.store.fail_many([Outcome(older.id, "w1", error="last to die")], clock())
    page = dash.get("/").get_data(as_text=True)
    assert f'data-job="{older.id}"' in page and "last to die" in page
    assert f'data-job="{newer.id}"' not in page


# -- 3. tooltips on Discard and Cancel… ----------------------------------------------


def _help(page: str, label: str, tag: str = "button") -> str:
    """The title of the control labelled ``label``, which its accessible
    description must repeat."""
    match = re.search(rf'<{tag} [^>]*title="([^"]+)" aria-description="([^"]+)"[^>]*>{re.escape(label)}</{tag}>', page)
    assert match, f"{label} has no title and description"
    assert match.group(1) == match.group(2)
    return html.unescape(match.group(1))


def test_discard_and_cancel_say_what_they_do(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    page = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "not run again" in _help(page, "Discard")
    assert "cancelled at once" in _help(page, "Cancel…", "summary")
    rows = dash.get("/jobs/pending").get_data(as_text=True)
    assert "moves to Discarded" in _help(rows, "Discard")


def test_cancel_on_a_running_job_says_its_handler_is_asked_to_stop(dash, deck) -> None:
    job_id = _running(deck)
    page = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "Ask its handler to stop" in _help(page, "Cancel…", "summary")


# -- 4. cancel selected ---------------------------------------------------------------


def test_cancel_selected_is_offered_on_the_tabs_whose_jobs_can_be_cancelled(dash, deck) -> None:
    _running(deck)
    for tab in ("pending", "scheduled", "failed", "running"):
        page = dash.get(f"/jobs/{tab}").get_data(as_text=True)
        assert "Cancel selected</button>" in page and 'id="select-all"' in page, tab
    assert 'class="row-select"' in dash.get("/jobs/running").get_data(as_text=True)
    for tab in ("dead", "completed", "discarded", "cancelled"):
        assert "Cancel selected" not in dash.get(f"/jobs/{tab}").get_data(as_text=True), tab


def test_cancel_selected_cancels_pending_jobs_and_audits_it(dash, deck) -> None:
    ids = [deck.enqueue("demo.noop", {"n": i})[0].id for i in range(3)]
    (done,) = _finished(deck, REPORT)
    r = post(dash, "/actions/selected/cancel", {"tab": "pending", "ids": [str(i) for i in [*ids, done]]})
    page = r.get_data(as_text=True)
    assert r.status_code == 200 and r.headers["HX-Trigger"] == "jd-selection-clear"
    assert "3 of 4 selected jobs cancelled. 1 had moved on" in page
    assert page.lstrip().startswith('<tbody id="job-rows"')
    assert [deck.store.get(i).status for i in ids] == [State.CANCELLED] * 3
    assert deck.store.get(done).status is State.COMPLETED
    (entry,), _ = list_audit(deck.store)
    assert (entry.actor, entry.action, entry.count) == ("local operator", "cancel selected", 3)
    assert entry.detail == "selected 4 in Pending"
    assert entry.progress(deck.clock()).describe() == "3 of 4; 1 had moved on"


def test_cancel_selected_asks_running_jobs_to_stop(dash, deck) -> None:
    job_id = _running(deck)
    r = post(dash, "/actions/selected/cancel", {"tab": "running", "ids": [str(job_id)]})
    assert r.status_code == 200 and "1 of 1 selected jobs asked to stop" in r.get_data(as_text=True)
    job = deck.store.get(job_id)
    assert job.status is State.RUNNING and job.cancel_requested_at == deck.clock()
    deck.store.complete(job_id, "w1", deck.clock())
    assert deck.store.get(job_id).status is State.CANCELLED


def test_cancel_selected_refuses_a_viewer(deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    users = {"ann": {"password_hash": password_hash("ann-secret-1"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    client.post("/login", data={"username": "ann", "password": "ann-secret-1", "csrf_token": token})
    assert "Cancel selected" not in client.get("/jobs/pending").get_data(as_text=True)
    assert post(client, "/actions/selected/cancel", {"tab": "pending", "ids": [str(job.id)]}).status_code == 403
    assert deck.store.get(job.id).status is State.PENDING and list_audit(deck.store)[0] == []


def test_cancel_selected_without_csrf_is_refused(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    r = post(dash, "/actions/selected/cancel", {"tab": "pending", "ids": [str(job.id)]}, token=False)
    assert r.status_code == 400 and deck.store.get(job.id).status is State.PENDING


def test_cancel_is_no_all_matching_action(dash, deck) -> None:
    job, _ = deck.enqueue("demo.noop")
    assert post(dash, "/actions/matching/cancel", {"tab": "pending", "up_to": job.id}).status_code == 404
    assert dash.get("/jobs/pending/confirm/cancel").status_code == 404
    assert post(dash, "/actions/selected/explode", {"tab": "pending", "ids": [str(job.id)]}).status_code == 404
    assert deck.store.get(job.id).status is State.PENDING


# -- 5. the error-group filter -------------------------------------------------------


def test_the_error_filter_survives_the_filter_form_and_can_be_removed(dash, deck) -> None:
    make_dead(deck)
    from jobdeck.core.fingerprint import fingerprint

    fp = fingerprint("boom\nsecond line")
    page = dash.get("/jobs/dead", query_string={"type": "demo.fail", "error": fp}).get_data(as_text=True)
    form = re.search(r'<form class="filters".*?</form>', page, re.S).group(0)
    assert f'<input type="hidden" name="error" value="{fp}">' in form
    chip = re.search(
        r'<a class="btn btn-ghost filter-chip" href="([^"]+)"[^>]*>Error: <span class="mono">([^<]+)</span>', form
    )
    assert chip and chip.group(2) == fp
    assert html.unescape(chip.group(1)) == "/jobs/dead?type=demo.fail"
    plain = dash.get("/jobs/dead", query_string={"type": "demo.fail"}).get_data(as_text=True)
    assert 'name="error"' not in plain and "filter-chip" not in plain


def test_the_error_chip_escapes_the_fingerprint(dash) -> None:
    page = dash.get("/jobs/dead", query_string={"error": '"><script>x</script>'}).get_data(as_text=True)
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
