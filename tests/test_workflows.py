"""Workflows and batches in one process (``jobdeck.jobs.workflows``, ``jobdeck.store.graph``):
promotion in the completing transaction, the failure policies, refusals
that insert nothing, batch callbacks, dependency results and retention, on
SQLite and PostgreSQL. Several processes at once: ``test_workflows_processes``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from jobdeck.core.errors import InvalidField, TransitionRefused
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter, Outcome
from jobdeck.store.graph import BatchClosed
from jobdeck.store.models import batches, job_dependencies, jobs, workflows
from sqlalchemy import func, select

from tests.conftest import Clock

pytestmark = pytest.mark.backends


def _count(deck: Jobdeck, table: Any) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _run_all(deck: Jobdeck, *, fail: set[str] = frozenset(), worker: str = "w1") -> list[str]:  # type: ignore[assignment]
    """Claim and finish what is claimable until nothing is: completes each
    job (result: its step), fails non-retryably those whose step is in
    ``fail``. Returns the steps in the order they ran."""
    ran: list[str] = []
    while claimed := deck.store.claim(worker, deck.clock(), limit=10):
        done = [j for j in claimed if j.step not in fail]
        for j in claimed:
            ran.append(j.step or str(j.id))
        deck.store.complete_many(
            [Outcome(j.id, worker, attempt=j.attempt, started_at=j.claimed_at, result={"step": j.step}) for j in done],
            deck.clock(),
        )
        failed = [j for j in claimed if j.step in fail]
        deck.store.fail_many(
            [Outcome(j.id, worker, attempt=j.attempt, error="boom", retryable=False) for j in failed], deck.clock()
        )
    return ran


def _diamond(deck: Jobdeck, **kw: Any) -> Any:
    return (
        deck.workflow("diamond", **kw)
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .add("c", "demo.noop", depends_on=["a"])
        .add("d", "demo.noop", depends_on=["b", "c"])
        .enqueue()
    )


def _states(deck: Jobdeck, wf: Any) -> dict[str, State]:
    return {name: deck.store.get(job_id).status for name, job_id in wf.jobs.items()}


def test_a_diamond_runs_in_dependency_order(deck: Jobdeck) -> None:
    wf = _diamond(deck)
    assert _states(deck, wf) == {"a": State.PENDING, "b": State.BLOCKED, "c": State.BLOCKED, "d": State.BLOCKED}
    ran = _run_all(deck)
    assert ran[0] == "a" and ran[-1] == "d" and sorted(ran[1:3]) == ["b", "c"] and len(ran) == 4
    assert set(_states(deck, wf).values()) == {State.COMPLETED}
    graph = deck.store.workflow(wf.id)
    assert graph.workflow.state == "completed" and graph.workflow.total == 4
    ids = wf.jobs
    assert set(graph.edges) == {(ids["b"], ids["a"]), (ids["c"], ids["a"]), (ids["d"], ids["b"]), (ids["d"], ids["c"])}


def test_a_dependent_is_promoted_by_the_completion_of_its_last_dependency_only(deck: Jobdeck) -> None:
    wf = _diamond(deck)
    _run_one(deck, "a")
    _run_one(deck, "b")
    assert deck.store.get(wf.jobs["d"]).status is State.BLOCKED
    assert deck.store.get(wf.jobs["d"]).deps_left == 1
    _run_one(deck, "c")
    d = deck.store.get(wf.jobs["d"])
    assert (d.status, d.deps_left) == (State.PENDING, 0)


def _run_one(deck: Jobdeck, step: str) -> None:
    claimed = deck.store.claim("w1", deck.clock(), limit=100)
    for j in claimed:
        if j.step == step:
            deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt)], deck.clock())
    deck.store.release("w1", [(j.id, j.attempt) for j in claimed if j.step != step], deck.clock())


def test_completing_two_siblings_in_one_acknowledgement_promotes_their_dependent(deck: Jobdeck) -> None:
    wf = _diamond(deck)
    _run_one(deck, "a")
    claimed = deck.store.claim("w1", deck.clock(), limit=10)
    assert sorted(j.step or "" for j in claimed) == ["b", "c"]
    accepted, refill = deck.store.complete_and_claim(
        [Outcome(j.id, "w1", attempt=j.attempt) for j in claimed], "w1", deck.clock(), limit=10
    )
    assert [j.id for j in refill] == [wf.jobs["d"]]  # promoted and claimed in the same transaction


def test_a_dead_dependency_cancels_its_dependents_by_default(deck: Jobdeck) -> None:
    wf = _diamond(deck)
    _run_all(deck, fail={"b"})
    states = _states(deck, wf)
    assert states == {"a": State.COMPLETED, "b": State.DEAD, "c": State.COMPLETED, "d": State.CANCELLED}
    assert deck.store.get(wf.jobs["d"]).error == "dependency b is dead"
    assert deck.store.workflow(wf.id).workflow.state == "dead"


def test_cancellation_runs_down_the_graph(deck: Jobdeck) -> None:
    wf = (
        deck.workflow("chain")
        .add("one", "demo.noop")
        .add("two", "demo.noop", depends_on=["one"])
        .add("three", "demo.noop", depends_on=["two"])
        .enqueue()
    )
    deck.store.cancel(wf.jobs["one"], deck.clock())
    assert _states(deck, wf) == {"one": State.CANCELLED, "two": State.CANCELLED, "three": State.CANCELLED}
    assert deck.store.get(wf.jobs["three"]).error == "dependency two is cancelled"


def test_hold_keeps_the_dependent_blocked_until_the_dependency_is_retried(deck: Jobdeck) -> None:
    wf = _diamond(deck, on_dependency_failure="hold")
    _run_all(deck, fail={"b"})
    assert _states(deck, wf)["d"] is State.BLOCKED
    assert deck.store.workflow(wf.id).workflow.state == "held"
    deck.store.retry(wf.jobs["b"], deck.clock())
    ran = _run_all(deck)
    assert ran == ["b", "d"]
    assert set(_states(deck, wf).values()) == {State.COMPLETED}


def test_the_policy_can_be_set_per_job(deck: Jobdeck) -> None:
    wf = (
        deck.workflow("mixed")
        .add("a", "demo.noop")
        .add("held", "demo.noop", depends_on=["a"], on_dependency_failure="hold")
        .add("gone", "demo.noop", depends_on=["a"])
        .enqueue()
    )
    _run_all(deck, fail={"a"})
    assert _states(deck, wf) == {"a": State.DEAD, "held": State.BLOCKED, "gone": State.CANCELLED}


def test_discarding_a_dead_dependency_cancels_dependents_that_hold_no_longer(deck: Jobdeck) -> None:
    wf = (
        deck.workflow("pair", on_dependency_failure="hold")
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .enqueue()
    )
    _run_all(deck, fail={"a"})
    deck.store.discard(wf.jobs["a"], deck.clock())
    assert _states(deck, wf)["b"] is State.BLOCKED  # hold: a person may still retry the discarded job
    deck.store.retry(wf.jobs["a"], deck.clock())
    assert _run_all(deck) == ["a", "b"]


def test_a_blocked_job_is_never_claimed_and_cannot_be_retried_or_run_now(deck: Jobdeck, clock: Clock) -> None:
    wf = _diamond(deck)
    clock.advance(3600)
    claimed = deck.store.claim("w1", clock(), limit=10)
    assert [j.step for j in claimed] == ["a"]
    with pytest.raises(TransitionRefused):
        deck.store.retry(wf.jobs["d"], clock())
    assert deck.store.cancel(wf.jobs["d"], clock()).status is State.CANCELLED


@pytest.mark.parametrize(
    "jobs_, message",
    [
        ([{"name": "a", "type": "demo.noop", "depends_on": ["b"]}, {"name": "b", "type": "demo.noop", "depends_on": ["a"]}], "cycle: a -> b -> a"),
        ([{"name": "a", "type": "demo.noop", "depends_on": ["a"]}], "depends on itself"),
        ([{"name": "a", "type": "demo.noop", "depends_on": ["zzz"]}], "'zzz' is not a job of the workflow"),
        ([{"name": "a", "type": "demo.noop"}, {"name": "a", "type": "demo.noop"}], "names two jobs"),
        ([{"name": "a", "type": "no.such.type"}], "jobs[0].type: unknown job type"),
        ([{"name": "a", "type": "demo.noop", "idempotency_key": "k"}], "not allowed in a workflow"),
        ([], "non-empty list"),
    ],
)  # fmt: skip
def test_a_bad_workflow_is_refused_with_nothing_inserted(deck: Jobdeck, jobs_: list[Any], message: str) -> None:
    with pytest.raises(InvalidField) as err:
        deck.enqueue_workflow({"name": "bad", "jobs": jobs_})
    assert message in str(err.value)
    assert (_count(deck, jobs), _count(deck, workflows), _count(deck, job_dependencies)) == (0, 0, 0)


def test_a_workflow_larger_than_max_jobs_is_refused(make_deck: Any) -> None:
    deck = make_deck(workflows={"max_jobs": 3})
    items = [{"name": f"j{i}", "type": "demo.noop"} for i in range(4)]
    with pytest.raises(InvalidField, match="at most 3 jobs"):
        deck.enqueue_workflow({"name": "big", "jobs": items})
    assert _count(deck, jobs) == 0


def test_a_workflow_key_enqueues_it_once(deck: Jobdeck) -> None:
    data = {"name": "nightly", "jobs": [{"name": "a", "type": "demo.noop"}], "key": "nightly:2026-12-01"}
    first = deck.enqueue_workflow(data)
    again = deck.enqueue_workflow(data)
    assert (first.created, again.created, again.id, again.jobs) == (True, False, first.id, first.jobs)
    assert _count(deck, jobs) == 1


def test_a_dependent_reads_its_dependencies_results(deck: Jobdeck) -> None:
    from jobdeck.jobs.handlers import JobContext

    wf = _diamond(deck)
    _run_all(deck)
    ctx = JobContext(deck.store, wf.jobs["d"], 1, "w1", "demo.noop")
    assert ctx.dependency_results() == {"b": {"step": "b"}, "c": {"step": "c"}}


# -- batches -----------------------------------------------------------------------


def _callbacks(deck: Jobdeck) -> list[Any]:
    return [j for j in deck.store.claim("cb", deck.clock(), limit=100) if "batch" in j.payload]


def test_a_batch_fires_its_callbacks_once_when_every_job_has_ended(deck: Jobdeck) -> None:
    batch = deck.batch(
        on_complete={"type": "demo.noop", "payload": {"to": "ops"}}, on_success="demo.noop", name="nightly"
    )
    ids = batch.add_many([{"type": "demo.noop", "payload": {"n": i}} for i in range(5)])
    batch.close()
    assert deck.store.batch(batch.id).fired_at is None
    claimed = deck.store.claim("w1", deck.clock(), limit=10)
    assert sorted(j.id for j in claimed) == ids
    deck.store.complete_many([Outcome(j.id, "w1", attempt=j.attempt) for j in claimed], deck.clock())
    fired = _callbacks(deck)
    assert sorted(j.payload["batch"]["callback"] for j in fired) == ["on_complete", "on_success"]
    complete = next(j for j in fired if j.payload["batch"]["callback"] == "on_complete")
    assert complete.payload["to"] == "ops"
    assert complete.payload["batch"]["counts"] == {"completed": 5} and complete.payload["batch"]["job_ids"] == ids
    record = deck.store.batch(batch.id)
    assert record.state == "fired" and record.outcome is not None
    assert sorted(record.outcome["callbacks"]) == ["on_complete", "on_success"]


def test_a_batch_with_a_dead_job_fires_on_complete_and_on_dead(deck: Jobdeck) -> None:
    batch = deck.batch(on_complete="demo.noop", on_success="demo.noop", on_dead="demo.noop")
    first, second = batch.add_many([{"type": "demo.noop"}, {"type": "demo.noop"}])
    batch.close()
    (a, b) = sorted(deck.store.claim("w1", deck.clock(), limit=10), key=lambda j: j.id)
    deck.store.complete_many([Outcome(a.id, "w1", attempt=a.attempt)], deck.clock())
    assert _count_callbacks(deck) == 0
    deck.store.fail_many([Outcome(b.id, "w1", attempt=b.attempt, error="x", retryable=False)], deck.clock())
    fired = _callbacks(deck)
    assert sorted(j.payload["batch"]["callback"] for j in fired) == ["on_complete", "on_dead"]
    assert fired[0].payload["batch"]["counts"] == {"completed": 1, "dead": 1}


def _count_callbacks(deck: Jobdeck) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).where(jobs.c.batch_id.is_(None))).scalar_one())


def test_an_open_batch_does_not_fire_and_closing_it_late_fires_it(deck: Jobdeck) -> None:
    batch = deck.batch(on_complete="demo.noop")
    batch.add("demo.noop")
    _run_all(deck)
    assert deck.store.batch(batch.id).fired_at is None  # open: more may come
    batch.add("demo.noop")  # any process may add while it is open
    _run_all(deck)
    batch.close()  # every job had ended: the close fires it
    (callback,) = _callbacks(deck)
    assert callback.payload["batch"]["counts"] == {"completed": 2}
    with pytest.raises(BatchClosed):
        batch.add("demo.noop")
    with pytest.raises(BatchClosed):
        deck.open_batch(batch.id).close()


def test_a_batch_used_as_a_context_closes_on_exit(deck: Jobdeck) -> None:
    with deck.batch(on_complete="demo.noop") as batch:
        batch.add("demo.noop")
    assert deck.store.batch(batch.id).closed_at is not None


def test_a_bad_callback_is_refused(deck: Jobdeck) -> None:
    with pytest.raises(InvalidField, match="on_complete.type"):
        deck.batch(on_complete="no.such.type")
    assert _count(deck, batches) == 0


# -- retention ---------------------------------------------------------------------


def test_retention_removes_a_workflow_whole_once_every_job_finished(deck: Jobdeck, clock: Clock) -> None:
    _diamond(deck)
    _run_one(deck, "a")
    clock.advance(30 * 86400)
    assert deck.maintenance.prune_once(clock())["jobs"] == 0  # a is old, but its workflow is not finished
    assert _count(deck, jobs) == 4
    _run_all(deck)
    clock.advance(30 * 86400)
    assert deck.maintenance.prune_once(clock())["jobs"] == 4
    assert (_count(deck, jobs), _count(deck, workflows), _count(deck, job_dependencies)) == (0, 0, 0)


def test_retention_keeps_plain_jobs_rules(deck: Jobdeck, clock: Clock) -> None:
    deck.enqueue("demo.noop")
    _run_all(deck)
    clock.advance(timedelta(days=30).total_seconds())
    assert deck.maintenance.prune_once(clock())["jobs"] == 1


def test_retrying_the_failed_part_runs_the_held_rest(deck: Jobdeck) -> None:
    wf = _diamond(deck, on_dependency_failure="hold")
    _run_all(deck, fail={"b", "c"})
    assert sorted(deck.store.retry_workflow(wf.id, deck.clock())) == sorted(
        [wf.jobs["b"], wf.jobs["c"]]
    )  # no order promised
    assert sorted(_run_all(deck)) == ["b", "c", "d"]
    assert deck.store.workflow(wf.id).workflow.state == "completed"


def test_cancelling_the_rest_cancels_every_unfinished_job(deck: Jobdeck) -> None:
    wf = _diamond(deck)
    _run_one(deck, "a")
    assert len(deck.store.cancel_workflow(wf.id, deck.clock())) == 3
    assert _states(deck, wf) == {"a": State.COMPLETED, "b": State.CANCELLED, "c": State.CANCELLED, "d": State.CANCELLED}
    assert deck.store.workflow(wf.id).workflow.state == "cancelled"


def test_a_cancelled_dependency_cancels_even_a_holding_dependent(deck: Jobdeck) -> None:
    wf = (
        deck.workflow("chain")
        .add("a", "demo.noop")
        .add("b", "demo.noop", depends_on=["a"])
        .add("c", "demo.noop", depends_on=["b"], on_dependency_failure="hold")
        .enqueue()
    )
    _run_all(deck, fail={"a"})
    assert _states(deck, wf) == {"a": State.DEAD, "b": State.CANCELLED, "c": State.CANCELLED}
    assert deck.store.get(wf.jobs["c"]).error == "dependency b is cancelled"


# -- what a first user ran into ------------------------------------------------------


def test_a_string_depends_on_is_refused_not_split_into_letters(deck: Jobdeck) -> None:
    builder = deck.workflow("s").add("A", "demo.noop").add("B", "demo.noop")
    with pytest.raises(InvalidField, match="must be a list of job names, not a string"):
        builder.add("AB", "demo.noop", depends_on="AB")
    with pytest.raises(InvalidField, match="payload"):
        deck.workflow("p").add("a", "demo.noop", [1, 2]).enqueue()  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["line\nbreak", "tab\there", "x\u202eevil", "ctl\u0001"])
def test_names_with_control_characters_are_refused(deck: Jobdeck, name: str) -> None:
    with pytest.raises(InvalidField, match="no control characters"):
        deck.enqueue_workflow({"name": name, "jobs": [{"name": "a", "type": "demo.noop"}]})
    with pytest.raises(InvalidField, match="no control characters"):
        deck.enqueue_workflow({"name": "ok", "jobs": [{"name": name, "type": "demo.noop"}]})
    with pytest.raises(InvalidField, match="no control characters"):
        deck.batch(name=name)
    assert _count(deck, jobs) == _count(deck, batches) == 0


def test_a_key_of_another_workflow_is_a_conflict_and_schedule_keys_are_reserved(deck: Jobdeck) -> None:
    from jobdeck.store.graph import WorkflowKeyConflict

    first = deck.enqueue_workflow({"name": "one", "key": "k", "jobs": [{"name": "a", "type": "demo.noop"}]})
    with pytest.raises(WorkflowKeyConflict) as err:
        deck.enqueue_workflow({"name": "other", "key": "k", "jobs": [{"name": "a", "type": "demo.noop"}]})
    assert err.value.status_code == 409 and err.value.existing_id == first.id
    with pytest.raises(InvalidField, match="schedules' own"):
        deck.enqueue_workflow({"name": "x", "key": "schedule:nightly:2026-12-01T02:00:00+00:00", "jobs": [
            {"name": "a", "type": "demo.noop"}]})  # fmt: skip


def test_a_callback_takes_only_what_it_uses_and_a_types_unique_does_not_refuse_it(make_deck: Any) -> None:
    deck = make_deck(types={"demo.noop": {"unique": True}})
    batch = deck.batch(on_complete="demo.noop")  # the type's unique does not apply to a callback
    with pytest.raises(InvalidField, match="on_complete.delay_seconds: unknown field"):
        deck.batch(on_complete={"type": "demo.noop", "delay_seconds": 100})
    with pytest.raises(InvalidField, match="on_complete.payload.batch"):
        deck.batch(on_complete={"type": "demo.noop", "payload": {"batch": 1}})
    assert deck.store.batch(batch.id).state == "open"


def test_a_batch_left_by_an_exception_is_closed_and_a_second_close_says_so(deck: Jobdeck) -> None:
    with pytest.raises(RuntimeError), deck.batch(on_complete="demo.noop") as batch:
        batch.add("demo.noop")
        raise RuntimeError("boom")
    assert deck.store.batch(batch.id).closed_at is not None
    with pytest.raises(BatchClosed, match="already closed"):
        batch.close()


def test_a_callback_lists_a_bounded_number_of_ids(deck: Jobdeck, monkeypatch: Any) -> None:
    from jobdeck.store import graph_store

    monkeypatch.setattr(graph_store, "MAX_CALLBACK_IDS", 3)
    with deck.batch(on_complete="demo.noop") as batch:
        ids = batch.add_many([{"type": "demo.noop"} for _ in range(5)])
    _run_all(deck)
    (callback,) = [j for j in deck.store.list_jobs(JobFilter(limit=20), deck.clock()) if "batch" in j.payload]
    assert callback.payload["batch"]["job_ids"] == ids[:3] and callback.payload["batch"]["more_job_ids"] == 2


def test_retention_keeps_the_jobs_of_a_batch_that_has_not_fired(deck: Jobdeck, clock: Clock) -> None:
    batch = deck.batch(on_complete="demo.noop")
    batch.add_many([{"type": "demo.noop"}, {"type": "demo.noop"}])
    _run_all(deck)
    clock.advance(30 * 86400)
    assert deck.maintenance.prune_once(clock())["jobs"] == 0  # open: its callback will count them
    batch.close()
    _run_all(deck)
    (callback_id,) = deck.store.batch(batch.id).outcome["callbacks"].values()  # type: ignore[index]
    assert deck.store.get(callback_id).payload["batch"]["counts"] == {"completed": 2}
    clock.advance(30 * 86400)
    assert deck.maintenance.prune_once(clock())["jobs"] == 3  # fired: its jobs and the callback go
    assert _count(deck, batches) == 0


@pytest.mark.slow
def test_retention_goes_through_more_workflows_than_one_transaction_holds(deck: Jobdeck, clock: Clock) -> None:
    for i in range(150):
        deck.enqueue_workflow({"name": f"w{i}", "jobs": [{"name": "a", "type": "demo.noop"}]})
    _run_all(deck)
    clock.advance(30 * 86400)
    assert deck.maintenance.prune_once(clock())["jobs"] == 150
    assert _count(deck, workflows) == 0
