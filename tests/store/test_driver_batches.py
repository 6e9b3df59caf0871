"""Batches as the pool's acker writes them: many completions (with and
without results, fenced per job) and their attempt rows, on PostgreSQL in
one statement over arrays (``attempt_statements.complete_recorded``); a claimed job
decoded by position equals the job read back."""

from __future__ import annotations

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob, Outcome

from tests.store.driver import Driver

pytestmark = pytest.mark.backends


def test_a_batch_of_completions_applies_each_fenced_one_with_its_result_and_attempt(drv: Driver) -> None:
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(300)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=300)
    assert len(claimed) == 300
    assert claimed[0] == drv.store.get(claimed[0].id)  # the positional decoder agrees with the read
    stale, intruder, rest = claimed[0], claimed[1], claimed[2:]
    outcomes = [Outcome(stale.id, "w1", attempt=stale.attempt + 1, started_at=drv.now)]
    outcomes.append(Outcome(intruder.id, "w2", attempt=intruder.attempt, started_at=drv.now))
    outcomes += [
        Outcome(j.id, "w1", attempt=j.attempt, started_at=drv.now, result={"n": j.payload["i"]} if i % 2 else None)
        for i, j in enumerate(rest)
    ]
    outcomes.append(Outcome(rest[0].id, "w1", attempt=rest[0].attempt, started_at=drv.now))  # the same one twice

    accepted = drv.store.complete_many(outcomes, drv.now)

    assert sorted(accepted) == sorted({j.id for j in rest})
    for i, j in enumerate(rest):
        done = drv.store.get(j.id)
        assert done.status is State.COMPLETED and done.finished_at == drv.now
        assert done.result == ({"n": j.payload["i"]} if i % 2 else None)
        assert [(a.attempt, a.outcome, a.worker_id) for a in drv.store.attempts_of(j.id)] == [(1, "completed", "w1")]
    for refused in (stale, intruder):
        assert drv.store.get(refused.id).status is State.RUNNING
        assert drv.store.attempts_of(refused.id) == []


def test_a_batch_of_failures_writes_each_attempt_with_its_own_error(drv: Driver) -> None:
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}, max_retries=1) for i in range(50)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=50)
    outcomes = [Outcome(j.id, "w1", attempt=j.attempt, error=f"boom {j.id}", traceback="tb") for j in claimed]
    failed = drv.store.fail_many(outcomes, drv.now)
    assert {j.status for j in failed} == {State.FAILED}
    released = drv.store.release("w2", [(j.id, j.attempt) for j in claimed], drv.now)
    assert released == []  # not its holder: nothing moves, nothing is written
    for j in claimed:
        (attempt,) = drv.store.attempts_of(j.id)
        assert (attempt.outcome, attempt.error) == ("failed", f"boom {j.id}")


def test_a_batch_of_failures_fences_each_one_and_answers_in_the_order_given(drv: Driver) -> None:
    """On PostgreSQL one UPDATE over arrays per kind (retryable or not):
    each failure still fenced by its own (job, attempt, worker), with its
    own error (written as given), backoff and attempt row."""
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}, max_retries=1) for i in range(40)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=40)
    stale, intruder, rest = claimed[0], claimed[1], claimed[2:][::-1]
    texts = ['a"b', "c\\d", "x,y {z}", "NULL", "é ✓ 𝄞"]
    errors = {j.id: f"{texts[i % len(texts)]} {j.id}" for i, j in enumerate(rest)}
    retryable = {j.id: i % 3 != 0 for i, j in enumerate(rest)}
    outcomes = [Outcome(stale.id, "w1", attempt=stale.attempt + 1, error="stale")]
    outcomes.append(Outcome(intruder.id, "w2", attempt=intruder.attempt, error="intruder"))
    outcomes += [Outcome(j.id, "w1", attempt=j.attempt, error=errors[j.id], retryable=retryable[j.id]) for j in rest]
    outcomes.append(Outcome(rest[1].id, "w1", attempt=rest[1].attempt, error="again", retryable=False))

    failed = drv.store.fail_many(outcomes, drv.now)

    assert [j.id for j in failed] == [j.id for j in rest]  # the same attempt twice: the first one counts
    for j in rest:
        now = drv.store.get(j.id)
        if retryable[j.id]:
            assert (now.status, now.retry_count) == (State.FAILED, 1) and now.available_at > drv.now
        else:
            assert (now.status, now.retry_count, now.finished_at) == (State.DEAD, 0, drv.now)
        assert now.error == errors[j.id]
        assert [(a.attempt, a.outcome, a.worker_id, a.error) for a in drv.store.attempts_of(j.id)] == [
            (1, "failed", "w1", errors[j.id])
        ]
    for refused in (stale, intruder):
        assert drv.store.get(refused.id).status is State.RUNNING
        assert drv.store.attempts_of(refused.id) == []


def test_array_literals_carry_quotes_braces_commas_and_nulls() -> None:
    from datetime import UTC, datetime

    from jobdeck.store.postgres import int_array, text_array, time_array

    assert int_array([1, None, 3]) == "{1,NULL,3}"
    assert text_array(['a"b', "c\\d", None, "x,y {z}", "NULL"]) == '{"a\\"b","c\\\\d",NULL,"x,y {z}","NULL"}'
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert time_array([when, None]) == "{2026-01-02T03:04:05.000006+00:00,NULL}"
    with pytest.raises(ValueError, match="naive"):
        time_array([datetime(2026, 1, 1)])


def test_hostile_results_and_errors_survive_the_batch_as_written(drv: Driver) -> None:
    texts = ['{"a": "\\"}', "x,y}{", "NULL", "", "back\\slash", 'quote"', "é ✓ 𝄞"]
    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(2 * len(texts))], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=2 * len(texts))
    ok, bad = claimed[: len(texts)], claimed[len(texts) :]
    drv.store.complete_many(
        [Outcome(j.id, "w1", attempt=j.attempt, started_at=drv.now, result=t) for j, t in zip(ok, texts)], drv.now
    )
    drv.store.release("w1", [(j.id, j.attempt) for j in bad], drv.now, interrupted={j.id: drv.now for j in bad})
    assert [drv.store.get(j.id).result for j in ok] == texts
    assert all(len(drv.store.attempts_of(j.id)) == 1 for j in bad)


def test_the_claim_finds_its_rows_by_key_on_an_analyzed_table(drv: Driver) -> None:
    """Given ``id IN (subquery)`` on an analyzed table, PostgreSQL's planner
    hash-joined the picked ids against a scan of the whole table on every
    claim; the claim must reach its rows by the primary key on both databases."""
    from jobdeck.store import claim_statements

    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(3000)], drv.now)
    prepared = claim_statements.claim(1, None, 0)
    values = ("w", drv.store._t(drv.now), "demo.noop", 250)
    with drv.store.engine.connect() as conn:
        if drv.store.sqlite:
            compiled = prepared.sqlite
            conn.exec_driver_sql("ANALYZE")
            plan = " | ".join(
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled.text, compiled.params(values))
            )
            assert "ix_jobs_claim" in plan and "SCAN jobs" not in plan.replace("SCAN jobs_", ""), plan
        else:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE jobs")
            stmt = prepared.stmt.compile(dialect=conn.dialect)
            params = {**stmt.params, **prepared.params(values)}
            plan = " | ".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + str(stmt), params))
            assert "Seq Scan" not in plan and "ix_jobs_claim" in plan, plan


@pytest.mark.parametrize("size", [1, 15, 16, 17, 33])
def test_batches_padded_to_a_shape_complete_and_release_each_pair_once(drv: Driver, size: int) -> None:
    """Completions and releases of ``size`` pairs run the statement of the
    next padded size (``attempt_statements.fenced_pairs``), the last pair repeated:
    here a refused one, so the padding must not let it through, nor count
    an accepted one twice."""
    from jobdeck.store import attempt_statements

    drv.store.enqueue_many([NewJob("demo.noop", {"i": i}) for i in range(2 * size + 2)], drv.now)
    claimed = drv.store.claim("w1", drv.now, limit=2 * size + 2)
    done, released, spare = claimed[:size], claimed[size : 2 * size], claimed[2 * size :]
    stale = Outcome(spare[0].id, "w1", attempt=spare[0].attempt + 1, started_at=drv.now)
    outcomes = [Outcome(j.id, "w1", attempt=j.attempt, started_at=drv.now) for j in done[:-1]] + [stale]
    assert attempt_statements.fenced_pairs([(o.job_id, o.attempt) for o in outcomes])[0] >= len(outcomes)

    assert sorted(drv.store.complete_many(outcomes, drv.now)) == sorted(j.id for j in done[:-1])
    for j in done[:-1]:
        assert [a.attempt for a in drv.store.attempts_of(j.id)] == [1]
    assert drv.store.get(spare[0].id).status is State.RUNNING
    held = [(j.id, j.attempt) for j in released] + [(spare[1].id, spare[1].attempt + 1)]
    moved = drv.store.release("w1", held, drv.now)
    assert sorted(moved) == sorted(j.id for j in released)
    assert {drv.store.get(j.id).status for j in released} == {State.PENDING}
    assert drv.store.get(spare[1].id).status is State.RUNNING


def test_one_acknowledgement_mixes_plain_workflow_batch_and_cancelled_jobs(drv: Driver) -> None:
    """The acker's batch outside any transaction (on PostgreSQL its plain
    jobs complete in one statement in autocommit, the rest in a transaction
    that moves what waits on them): each kind gets its own end, and every
    completion applied gets one attempt row."""
    deck = drv.deck
    wf = deck.workflow("pair").add("first", "demo.noop").add("then", "demo.noop", depends_on=["first"]).enqueue()
    batch = deck.batch(on_complete="demo.noop")
    (in_batch,) = batch.add_many([{"type": "demo.noop"}])
    batch.close()
    plain, to_cancel = (drv.enqueue().id for _ in range(2))
    claimed = {j.id: j for j in drv.store.claim("w1", drv.now, limit=10)}
    assert set(claimed) == {wf.jobs["first"], in_batch, plain, to_cancel}
    drv.store.cancel(to_cancel, drv.now)  # requested while it runs: the handler's return ends it cancelled
    outcomes = [Outcome(j.id, "w1", attempt=j.attempt, started_at=drv.now) for j in claimed.values()]
    outcomes.append(Outcome(plain, "w1", attempt=claimed[plain].attempt + 1, started_at=drv.now))  # a stale one

    assert sorted(drv.store.complete_many(outcomes, drv.now)) == sorted(claimed)

    assert drv.store.get(wf.jobs["then"]).status is State.PENDING  # promoted by its dependency's completion
    assert drv.store.batch(batch.id).fired_at is not None
    assert drv.store.get(to_cancel).status is State.CANCELLED
    (cancelled,) = drv.store.attempts_of(to_cancel)
    assert (cancelled.outcome, cancelled.error) == ("cancelled", "cancelled while running; the handler returned anyway")
    for job_id in (wf.jobs["first"], in_batch, plain):
        assert drv.store.get(job_id).status is State.COMPLETED
        assert [(a.attempt, a.outcome, a.error) for a in drv.store.attempts_of(job_id)] == [(1, "completed", None)]
