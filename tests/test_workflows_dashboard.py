"""The workflows and batches pages through the test client, on SQLite and
PostgreSQL: lists, the graph drawn as SVG with hostile step names escaped,
the live fragment, the two workflow actions (CSRF, audit, counts moved),
a batch's progress and callbacks, the job page's links, and the blocked
tab."""

from __future__ import annotations

import re
from typing import Any

import pytest
from dashboard_support import make_dash_app, post
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.audit import list_audit
from jobdeck.web.dashboard.graph_svg import MAX_SVG_NODES, layers, order_columns
from markupsafe import escape

pytestmark = pytest.mark.backends

HOSTILE = '<script>alert("x")</script>'
QUOTES = "\"&'"


def _run_all(deck: Jobdeck, *, fail: frozenset[str] = frozenset()) -> None:
    """Claim and finish what is claimable until nothing is; the steps in
    ``fail`` fail for good."""
    while claimed := deck.store.claim("w1", deck.clock(), limit=10):
        ok = [j for j in claimed if j.step not in fail]
        bad = [j for j in claimed if j.step in fail]
        deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in ok], deck.clock())
        deck.store.fail_many(
            [Outcome(j.id, "w1", attempt=j.attempt, error="boom", retryable=False) for j in bad], deck.clock()
        )


def _diamond(deck: Jobdeck, **kw: Any) -> Any:
    return (
        deck.workflow("diamond", **kw)
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .add("c", "demo.noop", depends_on=["a"])
        .add("d", "demo.noop", depends_on=["b", "c"])
        .enqueue()
    )


def _text(r: Any) -> str:
    assert r.status_code == 200, r.get_data(as_text=True)[:500]
    return str(r.get_data(as_text=True))


def _svg(page: str) -> str:
    match = re.search(r'<svg id="workflow-graph".*?</svg>', page, re.S)
    assert match, "no graph on the page"
    return match.group(0)


def _node_states(page: str) -> dict[int, str]:
    return {
        int(j): s
        for j, s in re.findall(r'class="wf-node node-[a-z]+"[^>]*data-job="(\d+)" data-state="([a-z]+)"', page)
    }


# -- lists -------------------------------------------------------------------------


def test_the_nav_links_the_workflows_and_batches_lists(dash: Any) -> None:
    page = _text(dash.get("/"))
    assert 'href="/workflows"' in page and ">Workflows</a>" in page
    assert 'href="/batches"' in page and ">Batches</a>" in page


def test_the_workflows_list_shows_each_newest_first_with_state_and_progress(dash: Any, deck: Jobdeck) -> None:
    first = _diamond(deck)
    _run_all(deck)
    second = deck.workflow(HOSTILE).add("only", "demo.noop").enqueue()
    page = _text(dash.get("/workflows"))
    assert page.index(f'data-workflow="{second.id}"') < page.index(f'data-workflow="{first.id}"')
    row = page[page.index(f'data-workflow="{first.id}"') :]
    assert "group-state-completed" in row[:1000] and "<strong>4</strong>/4" in row[:1000]
    assert f'href="/workflows/{first.id}"' in page
    assert HOSTILE not in page and str(escape(HOSTILE)) in page


def test_the_workflows_list_pages_by_cursor(dash: Any, deck: Jobdeck) -> None:
    from jobdeck.web.dashboard.workflows import PAGE_SIZE

    ids = [deck.workflow(f"w{i}").add("one", "demo.noop").enqueue().id for i in range(PAGE_SIZE + 2)]
    page = _text(dash.get("/workflows"))
    assert page.count("data-workflow=") == PAGE_SIZE
    older = re.search(r'href="/workflows\?before=(\d+)"', page)
    assert older, "no Older link"
    rest = _text(dash.get(f"/workflows?before={older.group(1)}"))
    shown = [int(i) for i in re.findall(r'data-workflow="(\d+)"', rest)]
    assert shown == [ids[1], ids[0]] and "Older" not in rest and "← Newest" in rest
    assert dash.get("/workflows?before=nope").status_code == 422


def test_the_batches_list_shows_state_and_progress(dash: Any, deck: Jobdeck) -> None:
    open_one = deck.batch(on_complete="demo.noop", name=HOSTILE)
    open_one.add("demo.noop")
    fired = deck.batch(on_complete="demo.noop", name="done")
    fired.add_many([{"type": "demo.noop"}, {"type": "demo.noop"}])
    fired.close()
    _run_all(deck)
    page = _text(dash.get("/batches"))
    assert page.index(f'data-batch="{fired.id}"') < page.index(f'data-batch="{open_one.id}"')
    fired_row = page[page.index(f'data-batch="{fired.id}"') :][:1200]
    assert "group-state-fired" in fired_row and "<strong>2</strong>/2" in fired_row
    open_row = page[page.index(f'data-batch="{open_one.id}"') :][:1200]
    assert "group-state-open" in open_row and "<strong>1</strong>/1" in open_row
    assert HOSTILE not in page


# -- a workflow's page ---------------------------------------------------------------


def test_the_workflow_page_draws_every_job_and_edge_coloured_by_state(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    page = _text(dash.get(f"/workflows/{wf.id}"))
    svg = _svg(page)
    assert _node_states(svg) == {
        wf.jobs["a"]: "pending", wf.jobs["b"]: "blocked", wf.jobs["c"]: "blocked", wf.jobs["d"]: "blocked",
    }  # fmt: skip
    assert svg.count('class="wf-edge') == 4 and svg.count('marker-end="url(#wf-arrow)"') == 4
    for job_id in wf.jobs.values():
        assert f'href="/jobs/{job_id}"' in svg
    assert 'hx-trigger="jd-poll from:body"' in page  # live while it runs
    _run_all(deck)
    done = _text(dash.get(f"/fragments/workflows/{wf.id}"))
    assert set(_node_states(done).values()) == {"completed"}
    assert "hx-trigger" not in done  # nothing moves any more: the poll stops
    assert done.count('class="wf-edge edge-completed"') == 4 and done.count('marker-end="url(#wf-arrow-done)"') == 4


def test_hostile_step_names_are_escaped_in_the_svg_and_the_table(dash: Any, deck: Jobdeck) -> None:
    wf = deck.workflow(QUOTES).add(HOSTILE, "demo.noop").add(QUOTES, "demo.noop", depends_on=[HOSTILE]).enqueue()
    page = _text(dash.get(f"/workflows/{wf.id}"))
    assert "<script>" not in page.replace('<script src="', "")
    assert "&lt;script&gt;" in _svg(page)
    assert "&#34;&amp;&#39;" in _svg(page)  # in the aria-label attribute, every quote escaped
    table = page[page.index('class="table compact stack-phone workflow-jobs"') :]
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in table
    assert f'<td class="mono step">{escape(QUOTES)}</td>' in table
    job_page = _text(dash.get(f"/jobs/{wf.jobs[QUOTES]}"))
    links = job_page[job_page.index('id="job-membership"') :]
    assert f"{escape(HOSTILE)}</a>" in links and f'<strong class="mono">{escape(QUOTES)}</strong>' in links
    assert "<script>" not in job_page.replace('<script src="', "")


def test_a_workflow_too_big_to_draw_still_lists_every_job(dash: Any, deck: Jobdeck) -> None:
    builder = deck.workflow("wide").add("root", "demo.noop")
    for i in range(MAX_SVG_NODES):
        builder = builder.add(f"leaf-{i}", "demo.noop", depends_on=["root"])
    wf = builder.enqueue()
    page = _text(dash.get(f"/workflows/{wf.id}"))
    assert 'id="workflow-graph"' not in page and f"up to {MAX_SVG_NODES}" in page
    assert page.count('<tr data-job="') == MAX_SVG_NODES + 1
    assert len(wf.jobs) == MAX_SVG_NODES + 1


def test_an_unknown_workflow_or_batch_is_404(dash: Any) -> None:
    for url in ("/workflows/999", "/fragments/workflows/999", "/workflows/999/confirm/retry", "/batches/999",
                "/fragments/batches/999"):  # fmt: skip
        r = dash.get(url)
        assert r.status_code == 404, url
        assert "does not exist" in r.get_data(as_text=True)
    assert post(dash, "/workflows/retry", {"workflow_id": 999}).status_code == 404
    assert post(dash, "/workflows/retry", {"workflow_id": "nope"}).status_code == 422
    assert post(dash, "/workflows/explode", {"workflow_id": 1}).status_code == 404
    assert dash.get("/workflows/1/confirm/explode").status_code == 404


def test_cancelled_dependents_are_explained_with_the_dependency_that_died(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    _run_all(deck, fail=frozenset({"b"}))
    page = _text(dash.get(f"/workflows/{wf.id}"))
    assert "cancelled because a dependency will not complete" in page
    assert "dependency b is dead" in page
    assert _node_states(_svg(page))[wf.jobs["d"]] == "cancelled"
    _text(post(dash, "/workflows/retry", {"workflow_id": wf.id}))
    _run_all(deck)
    assert deck.store.get(wf.jobs["b"]).status is State.COMPLETED
    after = _text(dash.get(f"/workflows/{wf.id}"))  # d stays cancelled, and the page still says why
    assert "cancelled because a dependency will not complete" in after and "dependency b is dead" in after


def test_a_blocked_job_a_person_cancelled_is_not_explained_as_a_dependency_s_failure(dash: Any, deck: Jobdeck) -> None:
    wf = deck.workflow("pair").add("a", "demo.noop").add("b", "demo.noop", depends_on=["a"]).enqueue()
    deck.store.cancel(wf.jobs["b"], deck.clock())
    page = _text(dash.get(f"/workflows/{wf.id}"))
    assert _node_states(_svg(page))[wf.jobs["b"]] == "cancelled"
    assert "cancelled because a dependency" not in page


def test_a_held_dependent_is_explained(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck, on_dependency_failure="hold")
    _run_all(deck, fail=frozenset({"b"}))
    page = _text(dash.get(f"/workflows/{wf.id}"))
    assert "held behind a failed dependency" in page and "held until b is retried and completes" in page
    assert 'data-state="held"' in page and 'hx-trigger="jd-poll from:body"' in page


# -- the actions ---------------------------------------------------------------------


def test_retry_failed_part_retries_the_dead_job_and_the_held_dependent_then_runs(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck, on_dependency_failure="hold")
    _run_all(deck, fail=frozenset({"b"}))
    confirm = _text(dash.get(f"/workflows/{wf.id}/confirm/retry"))
    assert "Retry 1 failed job" in confirm and 'hx-post="/workflows/retry"' in confirm
    assert f"hx-vals='{{\"workflow_id\": {wf.id}}}'" in confirm
    r = post(dash, "/workflows/retry", {"workflow_id": wf.id})
    body = _text(r)
    assert "1 job retried" in body and '<section id="workflow-live"' in body
    assert '<div id="confirm" hx-swap-oob="true"></div>' in body
    assert deck.store.get(wf.jobs["b"]).status is State.PENDING
    _run_all(deck)
    assert deck.store.get(wf.jobs["d"]).status is State.COMPLETED
    [entry] = list_audit(deck.store)[0]
    assert (entry.action, entry.count, entry.detail) == ("retry workflow", 1, f"workflow {wf.id}")


def test_cancel_the_rest_cancels_every_unfinished_job_and_says_how_many(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    claimed = deck.store.claim("w1", deck.clock(), limit=10)
    deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in claimed], deck.clock())
    confirm = _text(dash.get(f"/workflows/{wf.id}/confirm/cancel"))
    assert "Cancel the 3 unfinished jobs" in confirm
    body = _text(post(dash, "/workflows/cancel", {"workflow_id": wf.id}))
    assert "3 jobs cancelled." in body
    states = {s: deck.store.get(i).status for s, i in wf.jobs.items()}
    assert states == {"a": State.COMPLETED, "b": State.CANCELLED, "c": State.CANCELLED, "d": State.CANCELLED}
    again = _text(post(dash, "/workflows/cancel", {"workflow_id": wf.id}))
    assert "Nothing to cancel" in again


def test_without_htmx_a_workflow_action_redirects_back_with_its_message(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    r = post(dash, "/workflows/cancel", {"workflow_id": wf.id, "next": f"/workflows/{wf.id}"}, htmx=False)
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/workflows/{wf.id}")
    assert "4 jobs cancelled." in _text(dash.get(f"/workflows/{wf.id}"))


def test_a_workflow_action_without_the_csrf_token_is_refused(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    for action in ("retry", "cancel"):
        assert post(dash, f"/workflows/{action}", {"workflow_id": wf.id}, token=False).status_code == 400
        assert post(dash, f"/workflows/{action}", {"workflow_id": wf.id}, htmx=False, token=False).status_code == 400
    assert {deck.store.get(i).status for i in wf.jobs.values()} == {State.PENDING, State.BLOCKED}
    assert list_audit(deck.store)[0] == []


def test_a_viewer_sees_no_workflow_actions_and_is_refused_them(deck: Jobdeck) -> None:
    from tests.helpers import password_hash

    wf = _diamond(deck)
    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    login = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', login)
    assert token
    client.post("/login", data={"username": "victor", "password": "victor-secret", "csrf_token": token.group(1)})
    page = _text(client.get(f"/workflows/{wf.id}"))
    assert "Cancel the rest" not in page and "Retry failed part" not in page
    assert post(client, "/workflows/cancel", {"workflow_id": wf.id}).status_code == 403
    assert deck.store.get(wf.jobs["a"]).status is State.PENDING


# -- a batch's page ------------------------------------------------------------------


def test_a_batch_page_shows_progress_counts_and_its_callbacks_once_fired(dash: Any, deck: Jobdeck) -> None:
    batch = deck.batch(on_complete="demo.noop", on_dead="demo.noop", name=HOSTILE)
    ids = batch.add_many([{"type": "demo.noop"} for _ in range(3)])
    page = _text(dash.get(f"/batches/{batch.id}"))
    assert "group-state-open" in page and "<strong>0</strong>/3" in page
    assert HOSTILE not in page and "&lt;script&gt;" in page
    assert page.count('<tr data-job="') == 3 and 'hx-trigger="jd-poll from:body"' in page
    batch.close()
    claimed = deck.store.claim("w1", deck.clock(), limit=10, types=["demo.noop"])
    assert sorted(j.id for j in claimed) == ids
    deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in claimed], deck.clock())
    fired = _text(dash.get(f"/fragments/batches/{batch.id}"))
    record = deck.store.batch(batch.id)
    callback = record.outcome["callbacks"]["on_complete"] if record.outcome else None
    assert callback and "group-state-fired" in fired and "<strong>3</strong>/3" in fired
    assert f'href="/jobs/{callback}"' in fired
    assert "not fired (its condition was not met)" in fired  # on_dead: nothing died
    assert 'data-state="completed"' in fired and "hx-trigger" in fired  # polls until the callback has run
    _run_all(deck)
    assert "hx-trigger" not in _text(dash.get(f"/fragments/batches/{batch.id}"))


def test_a_big_batch_lists_its_first_jobs_only(dash: Any, deck: Jobdeck) -> None:
    from jobdeck.web.dashboard.workflows import BATCH_JOBS_SHOWN

    batch = deck.batch(on_complete="demo.noop")
    batch.add_many([{"type": "demo.noop"} for _ in range(BATCH_JOBS_SHOWN + 5)])
    page = _text(dash.get(f"/batches/{batch.id}"))
    assert page.count('<tr data-job="') == BATCH_JOBS_SHOWN
    assert f"the first {BATCH_JOBS_SHOWN} of {BATCH_JOBS_SHOWN + 5}" in page


# -- the job page and the blocked tab ------------------------------------------------


def test_a_job_page_links_its_workflow_dependencies_and_dependents(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    page = _text(dash.get(f"/jobs/{wf.jobs['b']}"))
    links = page[page.index('id="job-membership"') :]
    assert f'href="/workflows/{wf.id}"' in links and "diamond" in links
    deps = links[links.index('class="plain job-dependencies"') :]
    assert f'href="/jobs/{wf.jobs["a"]}"' in deps[: deps.index("</ul>")]
    dependents = links[links.index('class="plain job-dependents"') :]
    assert f'href="/jobs/{wf.jobs["d"]}"' in dependents[: dependents.index("</ul>")]
    assert "badge-blocked" in dependents


def test_a_job_page_links_its_batch_and_a_plain_job_shows_no_membership(dash: Any, deck: Jobdeck) -> None:
    batch = deck.batch(on_complete="demo.noop", name="nightly")
    job_id = batch.add("demo.noop")
    page = _text(dash.get(f"/jobs/{job_id}"))
    assert f'href="/batches/{batch.id}"' in page and "nightly" in page
    plain, _ = deck.enqueue("demo.noop", {})
    assert 'id="job-membership"' not in _text(dash.get(f"/jobs/{plain.id}"))


def test_the_blocked_tab_lists_blocked_jobs_with_their_badge(dash: Any, deck: Jobdeck) -> None:
    wf = _diamond(deck)
    page = _text(dash.get("/jobs/blocked"))
    assert re.search(r'href="/jobs/blocked"[^>]*>.*?Blocked <span class="count">3</span>', page, re.S)
    for step in ("b", "c", "d"):
        assert f'id="job-{wf.jobs[step]}"' in page
    assert f'id="job-{wf.jobs["a"]}"' not in page


# -- the layout ----------------------------------------------------------------------


def test_layers_put_each_job_after_its_deepest_dependency() -> None:
    # a -> b -> c and a -> c: c goes in column 2, not 1
    assert layers([1, 2, 3], [(2, 1), (3, 2), (3, 1)]) == {1: 0, 2: 1, 3: 2}


def test_ordering_puts_children_next_to_their_parents() -> None:
    # two chains whose second column starts in crossed id order: 1->4, 2->3
    columns = order_columns({1: 0, 2: 0, 3: 1, 4: 1}, [(4, 1), (3, 2)])
    assert columns == [[1, 2], [4, 3]]


def test_a_blocked_job_s_page_polls_so_its_promotion_shows(dash: Any, deck: Jobdeck) -> None:
    wf = deck.workflow("pair").add("a", "demo.noop").add("b", "demo.noop", depends_on=["a"]).enqueue()
    page = dash.get(f"/jobs/{wf.jobs['b']}").get_data(as_text=True)
    live = page[page.index('<div id="job-live"') :].split(">", 1)[0]
    assert 'hx-trigger="jd-poll from:body"' in live
