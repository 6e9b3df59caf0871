"""Workflows declared in config (``[workflows.NAME]``) and the schedules that
fire them (``[[schedules]]`` with ``workflow``): start-up checks naming the
key, one workflow per fire time however many decks fire it at once, Run now,
and the history and health read from the whole workflow, on SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.workflows import UnknownWorkflow
from jobdeck.maintenance.cron import fire_key
from jobdeck.store import Outcome
from jobdeck.store.models import jobs, schedule_runs, schedule_state, workflows
from sqlalchemy import func, select, update

from tests.conftest import Clock, wait_for

pytestmark = pytest.mark.backends

T = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
FIRED = datetime(2026, 1, 1, 12, 5, 1, tzinfo=UTC)


def nightly(**extra: Any) -> dict[str, Any]:
    return {
        "on_dependency_failure": "cancel",
        "jobs": [
            {"name": "extract-eu", "type": "demo.noop", "payload": {"region": "eu"}},
            {"name": "extract-us", "type": "demo.noop", "payload": {"region": "us"}},
            {"name": "build", "type": "demo.noop", "depends_on": ["extract-eu", "extract-us"]},
        ],
        **extra,
    }


def schedule(**extra: Any) -> dict[str, Any]:
    return {"name": "sales", "cron": "*/5 * * * *", "workflow": "nightly-sales", **extra}


def config(**tables: Any) -> dict[str, Any]:
    return {"workflows": {"nightly-sales": nightly()}, "schedules": [schedule()], **tables}


def _count(deck: Jobdeck, table: Any) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _run_all(deck: Jobdeck, fail: frozenset[str] = frozenset()) -> None:
    """Complete what is claimable until nothing is; fail (not retryable) the steps in ``fail``."""
    while claimed := deck.store.claim("w1", deck.clock(), limit=10):
        ok = [Outcome(j.id, "w1", attempt=j.attempt, result={"step": j.step}) for j in claimed if j.step not in fail]
        bad = [Outcome(j.id, "w1", attempt=j.attempt, error="boom", retryable=False) for j in claimed if j.step in fail]
        deck.store.complete_many(ok, deck.clock())
        deck.store.fail_many(bad, deck.clock())


# -- config ---------------------------------------------------------------------------


def test_a_config_workflow_is_checked_at_start_and_enqueued_by_name(make_deck: Any) -> None:
    deck = make_deck(**config())
    assert set(deck.configured_workflows) == {"nightly-sales"}
    assert deck.schedules.schedules["sales"].workflow == "nightly-sales"
    assert deck.schedules.schedules["sales"].type is None
    wf = deck.enqueue_named_workflow("nightly-sales", key="once")
    assert sorted(wf.jobs) == ["build", "extract-eu", "extract-us"] and wf.created
    build = deck.store.get(wf.jobs["build"])
    assert build.status is State.BLOCKED and build.workflow_id == wf.id
    again = deck.enqueue_named_workflow("nightly-sales", key="once")
    assert (again.id, again.jobs, again.created) == (wf.id, wf.jobs, False)
    assert _count(deck, jobs) == 3
    with pytest.raises(UnknownWorkflow) as err:
        deck.enqueue_named_workflow("nope")
    assert err.value.status_code == 404


def test_max_jobs_still_limits_api_workflows_beside_config_ones(make_deck: Any) -> None:
    deck = make_deck(workflows={"max_jobs": 3, "nightly-sales": nightly()})
    from jobdeck.core.errors import InvalidField

    with pytest.raises(InvalidField, match="at most 3 jobs"):
        deck.enqueue_workflow({"name": "big", "jobs": [{"name": f"j{i}", "type": "demo.noop"} for i in range(4)]})


def _with(**changes: Any) -> dict[str, Any]:
    return {"workflows": {"nightly-sales": nightly(**changes)}}


def _jobs(*items: dict[str, Any]) -> dict[str, Any]:
    return {"workflows": {"nightly-sales": {"jobs": list(items)}}}


@pytest.mark.parametrize(
    "tables, message",
    [
        ({"workflows": "nightly"}, "workflows: expected a table"),
        ({"workflows": {"max_jobs": 0}}, "workflows.max_jobs: expected a whole number >= 1"),
        ({"workflows": {"max_jobs": True}}, "workflows.max_jobs: expected a whole number >= 1"),
        ({"workflows": {"nightly-sales": 3}}, "workflows.nightly-sales: expected a table"),
        (_with(jbos=[]), "workflows.nightly-sales: unknown key 'jbos'"),
        (_with(key="k"), "workflows.nightly-sales: unknown key 'key'"),
        (_with(on_dependency_failure="ignore"), "workflows.nightly-sales: on_dependency_failure: must be one of"),
        ({"workflows": {"nightly-sales": {}}}, "workflows.nightly-sales: jobs: required, a non-empty list"),
        (_jobs({"name": "a", "type": "demo.nope"}), "workflows.nightly-sales: jobs[0].type"),
        (_jobs({"type": "demo.noop"}), "workflows.nightly-sales: jobs[0].name: required"),
        (_jobs({"name": "a", "type": "demo.noop", "depends_on": ["b"]}), "'b' is not a job of the workflow"),
        (_jobs({"name": "a", "type": "demo.noop"}, {"name": "a", "type": "demo.noop"}), "'a' names two jobs"),
        (
            _jobs(
                {"name": "a", "type": "demo.noop", "depends_on": ["b"]},
                {"name": "b", "type": "demo.noop", "depends_on": ["a"]},
            ),
            "workflows.nightly-sales: jobs: the dependencies form a cycle: a -> b -> a",
        ),
        (_jobs({"name": "a", "type": "demo.noop", "idempotency_key": "x"}), "jobs[0].idempotency_key: not allowed"),
        (_jobs({"name": "a", "type": "demo.noop", "payload": [1]}), "jobs[0].payload"),
        (
            {"workflows": {"max_jobs": 1, "nightly-sales": nightly()}},
            "workflows.nightly-sales: jobs: a workflow may have at most 1 jobs",
        ),
        ({**config(), "schedules": [schedule(type="demo.noop")]}, "schedule 'sales': give exactly one of type"),
        ({**config(), "schedules": [{"name": "sales", "cron": "* * * * *"}]}, "schedule 'sales': give exactly one"),
        ({**config(), "schedules": [schedule(workflow="nope")]}, "schedule 'sales': workflow: no [workflows.nope]"),
        ({**config(), "schedules": [schedule(workflow=["x"])]}, "schedule 'sales': workflow: no [workflows."),
        (
            {**config(), "schedules": [schedule(payload={"a": 1})]},
            "schedule 'sales': payload: not allowed with workflow",
        ),
        ({**config(), "schedules": [schedule(queue="q")]}, "schedule 'sales': queue: not allowed with workflow"),
        ({"schedules": [schedule()]}, "schedule 'sales': workflow: no [workflows.nightly-sales]"),
    ],
)
def test_a_bad_config_workflow_or_workflow_schedule_stops_startup_naming_it(
    make_config: Any, registry: Any, tables: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Jobdeck(make_config(**tables), registry)
    assert message in str(err.value)


# -- firing -----------------------------------------------------------------------------


def test_a_fire_time_enqueues_the_workflow_once_from_two_decks(make_deck: Any) -> None:
    clock = Clock(T)
    first, second = make_deck(clock=clock, **config()), make_deck(clock=clock, **config())
    assert first.schedules.enqueue_due_once(T) == [] and second.schedules.enqueue_due_once(T) == []
    clock.now = FIRED
    [a] = first.schedules.enqueue_due_once(FIRED)
    with first.store.write() as conn:  # the second read the watermark before the first moved it
        conn.execute(update(schedule_state).values(checked_until=T))
    [b] = second.schedules.enqueue_due_once(FIRED)
    assert a == b
    assert _count(first, workflows) == 1 and _count(first, jobs) == 3 and _count(first, schedule_runs) == 1
    key = fire_key("sales", datetime(2026, 1, 1, 12, 5, tzinfo=UTC))
    [wf] = first.store.list_workflows()
    assert (wf.name, wf.key, wf.state) == ("nightly-sales", key, "running")
    assert first.store.get(a).workflow_id == wf.id and first.store.get(a).step == "extract-eu"
    assert first.schedules.enqueue_due_once(FIRED) == []  # the watermark moved: nothing more


def test_two_decks_firing_the_same_time_at_once_make_one_workflow(make_deck: Any, monkeypatch: Any) -> None:
    """Both decks read the schedule's watermark before either fires, then
    both enqueue the fire: the UNIQUE key leaves one workflow, and each deck
    answers its first job. Starting the two threads together was not enough:
    starved of CPU, one deck fired and moved the watermark before the other
    read it, which then rightly found nothing due (CI saw ``[[1], []]``)."""
    clock = Clock(T)
    decks = [make_deck(clock=clock, **config()) for _ in range(2)]
    for d in decks:
        d.schedules.enqueue_due_once(T)
    clock.now = FIRED
    deadline = 120.0  # a deadline for a hang, never reached when both threads run
    start, read = threading.Barrier(2, timeout=deadline), threading.Barrier(2, timeout=deadline)
    for d in decks:

        def states_then_wait(now: datetime, states: Any = d.schedules._states) -> Any:
            found = states(now)
            read.wait()
            return found

        monkeypatch.setattr(d.schedules, "_states", states_then_wait)
    found: list[list[int]] = []
    errors: list[BaseException] = []

    def fire(deck: Jobdeck) -> None:
        try:
            start.wait()
            found.append(deck.schedules.enqueue_due_once(FIRED))
        except BaseException as exc:  # reported below, with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=fire, args=(d,)) for d in decks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline)
    assert not any(t.is_alive() for t in threads), f"a deck's fire did not end within {deadline} s"
    assert not errors, errors
    assert len(found) == 2 and found[0] == found[1] and len(found[0]) == 1, found
    assert _count(decks[0], workflows) == 1 and _count(decks[0], jobs) == 3


def test_history_and_health_judge_a_run_by_its_whole_workflow(make_deck: Any) -> None:
    clock = Clock(T)
    deck = make_deck(clock=clock, **config(schedules=[schedule(alert_after_failures=1)]))
    deck.schedules.enqueue_due_once(T)
    clock.now = FIRED
    [first] = deck.schedules.enqueue_due_once(FIRED)
    run = deck.schedules.overview(FIRED)[0]["runs"][0]
    assert (run["job_id"], run["status"]) == (first, "pending") and run["workflow_id"] is not None
    _run_all(deck, fail=frozenset({"extract-us"}))  # eu completed, us dead, build cancelled
    assert deck.store.get(first).status is State.COMPLETED  # the run's own job succeeded ...
    run = deck.schedules.overview(clock.now)[0]["runs"][0]
    assert run["status"] == "dead"  # ... but the workflow did not
    [(event, name)] = deck.schedule_health.check_once(clock.now)
    assert (event, name) == ("schedule.unhealthy", "sales")
    assert "boom" in deck.schedule_health.view()["sales"]["reason"]
    later = datetime(2026, 1, 1, 12, 10, 1, tzinfo=UTC)
    clock.now = later
    deck.schedules.enqueue_due_once(later)
    _run_all(deck)
    assert deck.schedules.overview(later)[0]["runs"][0]["status"] == "completed"
    assert deck.schedule_health.check_once(later) == [("schedule.recovered", "sales")]


# -- run now ------------------------------------------------------------------------------


def test_run_now_enqueues_the_workflow_from_the_page_with_csrf(make_config: Any, registry: Any) -> None:
    import re

    clock = Clock(T)
    deck = Jobdeck(make_config(**config()), registry, clock=clock)
    deck.init_db()
    client = create_app(deck=deck).test_client()
    try:
        page = client.get("/schedules").get_data(as_text=True)
        assert "sales" in page and "every 5 minutes" in page.lower()
        assert client.post("/schedules/sales/run").status_code == 400  # no CSRF token
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        r = client.post("/schedules/sales/run", data={"csrf_token": token})
        assert r.status_code == 303
        [wf] = deck.store.list_workflows()
        assert wf.key == f"schedule:sales:manual:{T.isoformat()}" and wf.total == 3
        first = min(deck.store.workflow(wf.id).jobs, key=lambda j: j.id)
        page = client.get("/schedules").get_data(as_text=True)
        # It names the workflow it started, a link to it, not its first job.
        assert (
            f'sales</bdi>: started workflow <a href="/workflows/{wf.id}"><bdi>nightly-sales</bdi> #{wf.id}</a>' in page
        )
        assert "enqueued job" not in page
        last = page.split('class="last-run"')[1].split("</td>")[0]
        assert f'href="/workflows/{wf.id}"' in last and f'href="/jobs/{first.id}"' not in last
        [run] = deck.schedules.overview(T)[0]["runs"]
        assert run["manual"] and run["job_id"] == first.id and run["workflow_id"] == wf.id
        api = client.get("/api/schedules").get_json()["schedules"][0]
        assert (api["workflow"], api["type"]) == ("nightly-sales", None)
        clock.now = T.replace(second=59)
        r = client.post("/schedules/sales/run", data={"csrf_token": token}, headers={"HX-Request": "true"})
        second = max(w.id for w in deck.store.list_workflows())
        flash = r.get_data(as_text=True).split('id="flash"')[1]
        assert f'started workflow <a href="/workflows/{second}"><bdi>nightly-sales</bdi> #{second}</a>' in flash
        clock.now = FIRED
        job = deck.schedules.run_now("sales", FIRED, "test")
        assert job.workflow_id is not None and job.workflow_id not in (wf.id, second) and _count(deck, workflows) == 3
    finally:
        deck.store.engine.dispose()


def test_the_demo_schedules_its_nightly_workflow(make_config: Any, registry: Any) -> None:
    deck = Jobdeck(make_config(demo=True), registry)
    deck.init_db()
    try:
        s = deck.schedules.schedules["demo-nightly"]
        assert s.workflow == "demo.nightly" and s.type is None
        wf = deck.enqueue_named_workflow("demo.nightly")
        graph = deck.store.workflow(wf.id)
        assert len(graph.jobs) == 5 and len(graph.edges) == 4
        assert {j.step for j in graph.jobs if j.status is State.PENDING} == {"extract-eu", "extract-us", "extract-apac"}
    finally:
        deck.store.engine.dispose()


def test_a_demo_config_with_its_own_workflows_table_keeps_the_demo_workflow(make_config: Any, registry: Any) -> None:
    deck = Jobdeck(make_config(demo=True, workflows={"max_jobs": 10}), registry)
    try:
        assert "demo.nightly" in deck.configured_workflows
    finally:
        deck.store.engine.dispose()


@pytest.mark.slow
def test_a_scheduled_demo_style_workflow_runs_to_the_end_on_a_real_pool(make_deck: Any) -> None:
    """The demo's handlers with a real worker pool and scheduler: the build
    runs after its extracts and reads their results."""
    steps = [
        {"name": "extract-eu", "type": "demo.extract", "payload": {"region": "eu", "seconds": 0}},
        {"name": "extract-us", "type": "demo.extract", "payload": {"region": "us", "seconds": 0}},
        {"name": "build", "type": "demo.build", "depends_on": ["extract-eu", "extract-us"]},
    ]
    deck = make_deck(
        workflows={"nightly-sales": {"jobs": steps}},
        schedules=[{"name": "sales", "cron": "* * * * * *", "workflow": "nightly-sales"}],
    )
    runtime = deck.start(workers=2)
    try:
        wait_for(lambda: any(w.state == "completed" for w in deck.store.list_workflows()), timeout=30)
    finally:
        runtime.stop(grace=5)
    done = next(w for w in deck.store.list_workflows() if w.state == "completed")
    graph = deck.store.workflow(done.id)
    by_step = {j.step: j for j in graph.jobs}
    extracts = [by_step["extract-eu"], by_step["extract-us"]]
    assert all(e.finished_at is not None for e in extracts)
    build = by_step["build"]
    assert build.claimed_at is not None and build.claimed_at >= max(e.finished_at for e in extracts)  # type: ignore[type-var]
    assert build.result == {"rows": sum(e.result["rows"] for e in extracts), "from": ["extract-eu", "extract-us"]}
    assert done.key is not None and done.key.startswith("schedule:sales:")
