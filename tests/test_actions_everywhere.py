"""One operator action, three front ends, one audit trail: the dashboard, the
API and the CLI each call ``jobdeck.actions``, so the same moves and the same
refusals leave the same audit rows, only the actor differs."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jobdeck import actions
from jobdeck.cli import main
from jobdeck.core.errors import TransitionRefused
from jobdeck.deck import Jobdeck
from jobdeck.store.audit import list_audit

from tests.dashboard_support import make_dead, post
from tests.test_cli import jobdeck_env

Act = Callable[[str, int], Any]
"""Ask one front end for ``action`` on a job: (action, job id)."""

ACTORS = {"dashboard": "local operator", "api": "api", "cli": "cli"}


@pytest.fixture
def front_ends(deck: Jobdeck, client: Any, dash: Any, tmp_path: Path) -> dict[str, Act]:
    """Each front end, acting on ``deck``'s database (the CLI in this process,
    on the same SQLite file)."""
    env = jobdeck_env(tmp_path)

    def cli(action: str, job_id: int) -> Any:
        return CliRunner().invoke(main, [action, str(job_id)], env=env)

    return {
        "dashboard": lambda action, job_id: post(dash, f"/actions/jobs/{job_id}/{action}", {"from": "detail"}),
        "api": lambda action, job_id: client.post(f"/api/jobs/{job_id}/{action}"),
        "cli": cli,
    }


def _rows(deck: Jobdeck, after: int) -> list[tuple[str, str, int, str | None]]:
    """The audit rows past id ``after``, oldest first: (actor, action, count,
    detail), the job's id in the detail written as N."""
    entries, _ = list_audit(deck.store, limit=1000)
    rows = []
    for e in sorted(entries, key=lambda e: e.id):
        if e.id > after:
            detail = re.sub(rf"\b{e.job_id}\b", "N", e.detail) if e.detail and e.job_id else e.detail
            rows.append((e.actor, e.action, e.count, detail))
    return rows


def _last_id(deck: Jobdeck) -> int:
    entries, _ = list_audit(deck.store, limit=1)
    return entries[0].id if entries else 0


def _script(deck: Jobdeck, act: Act) -> None:
    """Retry and discard a dead job twice each, cancel a pending one twice:
    each second time is refused (the job moved on)."""
    dead = make_dead(deck)
    for action in ("retry", "retry", "discard", "discard"):
        act(action, dead)
    waiting, _ = deck.enqueue("demo.noop", {})
    act("cancel", waiting.id)
    act("cancel", waiting.id)


def test_every_front_end_leaves_the_same_audit_rows(deck: Jobdeck, front_ends: dict[str, Act]) -> None:
    seen: dict[str, list[tuple[str, int, str | None]]] = {}
    for name, act in front_ends.items():
        start = _last_id(deck)
        _script(deck, act)
        rows = _rows(deck, start)
        assert {actor for actor, *_ in rows} == {ACTORS[name]}, name
        seen[name] = [(action, count, detail) for _, action, count, detail in rows]
    assert seen["dashboard"] == seen["api"] == seen["cli"]
    assert [(action, count) for action, count, _ in seen["api"]] == [
        ("retry", 1), ("retry", 0), ("discard", 1), ("discard", 0), ("cancel", 1), ("cancel", 0),
    ]  # fmt: skip
    assert all(detail.startswith("refused: job N is ") for _, count, detail in seen["api"] if count == 0)


def test_a_refused_retry_through_the_api_is_audited(deck: Jobdeck, client: Any) -> None:
    job, _ = deck.enqueue("demo.noop", {})
    assert client.post(f"/api/jobs/{job.id}/retry").status_code == 409
    assert _rows(deck, 0) == [
        ("api", "retry", 0, "refused: job N is pending; only failed or dead or discarded jobs can be retried")
    ]


def test_an_edit_is_audited_alike_from_the_dashboard_and_the_api(deck: Jobdeck, client: Any, dash: Any) -> None:
    """An edit that takes, and one refused because the job moved on (it was discarded)."""
    seen = {}
    for name, edit in {
        "dashboard": lambda job_id, priority: post(dash, f"/actions/jobs/{job_id}/edit", {"priority": str(priority)}),
        "api": lambda job_id, priority: client.patch(f"/api/jobs/{job_id}", json={"priority": priority}),
    }.items():
        start = _last_id(deck)
        job, _ = deck.enqueue("demo.noop", {})
        assert edit(job.id, 5).status_code == 200
        deck.store.discard(job.id, deck.clock())
        assert edit(job.id, 7).status_code == 409
        seen[name] = [row[1:] for row in _rows(deck, start)]
    assert seen["dashboard"] == seen["api"]
    assert [(action, count) for action, count, _ in seen["api"]] == [("edit", 1), ("edit", 0)]


def test_the_shared_action_writes_the_refusal_before_raising_it(deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", {})
    actions.discard(deck.store, job.id, "someone", deck.clock())
    with pytest.raises(TransitionRefused):
        actions.discard(deck.store, job.id, "someone", deck.clock())
    assert [(actor, action, count) for actor, action, count, _ in _rows(deck, 0)] == [
        ("someone", "discard", 1),
        ("someone", "discard", 0),
    ]


def test_all_matching_is_one_bulk_action_alike_from_the_dashboard_and_the_cli(
    deck: Jobdeck, dash: Any, tmp_path: Path
) -> None:
    """The dashboard's "all N matching" and the CLI's ``--all`` both go
    through ``actions.move_matching``: one entry each, opened with its total,
    counting what moved, finished; only the actor and the words differ."""
    from jobdeck.core.states import State
    from jobdeck.store.reads import newest_id

    env = jobdeck_env(tmp_path)
    run = {
        "dashboard": lambda: post(dash, "/actions/matching/retry",
                                  {"tab": "dead", "up_to": newest_id(deck.store), "total": 3}, htmx=False),
        "cli": lambda: CliRunner().invoke(main, ["retry", "--all", "--status", "dead", "--yes"], env=env),
    }  # fmt: skip
    seen = {}
    for name, act in run.items():
        start = _last_id(deck)
        dead = [make_dead(deck) for _ in range(3)]
        act()
        assert {deck.store.get(i).status for i in dead} == {State.PENDING}, name
        (entry,) = [e for e in list_audit(deck.store, limit=1000)[0] if e.id > start]
        assert entry.actor == ACTORS[name]
        seen[name] = (entry.action, entry.job_id, entry.count, entry.total, entry.finished_at is not None)
        deck.store.discard_ids(dead, deck.clock())  # out of the next front end's claim
    assert seen["dashboard"] == seen["cli"] == ("retry all", None, 3, 3, True)


def test_only_retry_discard_and_cancel_have_a_bulk_form(deck: Jobdeck) -> None:
    from jobdeck.core.states import Transition
    from jobdeck.store.audit import Tally, open_bulk

    entry = open_bulk(deck.store, "someone", "run now", deck.clock(), total=1, detail="one")
    job, _ = deck.enqueue("demo.noop", {}, delay_seconds=600)
    with pytest.raises(ValueError, match="run_now has no bulk form"):
        actions.move_ids(deck.store, Transition.RUN_NOW, [job.id], deck.clock(), Tally(entry))
