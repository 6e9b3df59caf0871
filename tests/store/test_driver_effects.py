"""The effects ledger over HTTP (``POST /api/jobs/<id>/effects/<key>/start``,
``finish``, ``withdraw``) on both databases: the same rows and rules as a
Python handler's ``ctx.effect``, fenced by the worker's attempt.

A start is refused (409, nothing written) unless the job is running the
attempt it names, held by the worker that names it, as a late complete is;
an unknown outcome sends the job to dead in the start's own transaction; a
done effect is skipped with its stored result by any later attempt, HTTP or
Python; and a person resolves an unknown one as for a Python handler."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.core.errors import EffectNotFound
from jobdeck.core.states import ALL_STATES, EffectState, State
from jobdeck.jobs import effects
from jobdeck.jobs.handlers import JobContext
from jobdeck.store import JobRecord

from tests.store.driver import DAY, STALL, Driver, race

pytestmark = pytest.mark.backends

KEY = "charge:o-1"
W = "w-http"


def _url(job_id: int, key: str, step: str) -> str:
    return f"/api/jobs/{job_id}/effects/{key}/{step}"


def post(drv: Driver, job: JobRecord, step: str, key: str = KEY, **body: Any) -> tuple[int, Any]:
    body = {"worker_id": job.worker_id, "attempt": job.attempt, **body}
    drv.clock.advance(1)
    r = drv.client.post(_url(job.id, key, step), json=body)
    return r.status_code, r.get_json()


def _ledger(drv: Driver, key: str = KEY) -> Any:
    try:
        return drv.store.ledger.get(key)
    except EffectNotFound:
        return None


def _rescued_and_claimed(drv: Driver, job: JobRecord, worker: str = W) -> JobRecord:
    """The worker's attempt stalls (its process died); the sweep rescues it
    and ``worker`` claims the job's next attempt."""
    later = drv.clock.advance(STALL * 2)
    assert [j.id for j in drv.store.rescue_stalled(later, STALL)] == [job.id]
    drv.clock.advance(DAY.total_seconds())
    return drv.claim_one(job, worker)


def test_done_is_recorded_once_and_every_later_attempt_skips_it(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    status, begun = post(drv, job, "start")
    assert status == 200 and begun["decision"] == "perform" and begun["replayed"] is False, begun
    assert (begun["effect"]["state"], begun["effect"]["attempt"], begun["effect"]["worker_id"]) == ("started", 1, W)
    status, done = post(drv, job, "finish", result={"charge_id": "ch_1"})
    assert status == 200 and (done["state"], done["result"]) == ("done", {"charge_id": "ch_1"}), done
    assert post(drv, job, "finish", result={"charge_id": "other"}) == (200, done), "the same finish again"

    # The attempt fails after its charge; the retry skips it, with the result.
    assert drv.client.post(f"/api/jobs/{job.id}/fail", json={"worker_id": W, "error": "mail failed"}).status_code == 200
    again = _rescued_or_due(drv, job)
    status, skip = post(drv, again, "start")
    assert status == 200 and skip["decision"] == "skip" and skip["effect"]["result"] == {"charge_id": "ch_1"}
    assert skip["effect"]["attempt"] == 1, "a skip leaves the row as the attempt that performed it wrote it"

    # Same table, same rules: a Python handler on another job meets the same row.
    other = drv.claim_one(drv.enqueue(), "w-python")
    ctx = JobContext(drv.store, other.id, other.attempt, "w-python", other.type, drv.clock)
    assert ctx.effect(KEY, lambda: pytest.fail("charged twice")) == {"charge_id": "ch_1"}


def _rescued_or_due(drv: Driver, job: JobRecord) -> JobRecord:
    drv.clock.advance(DAY.total_seconds())
    return drv.claim_one(job, W)


def test_a_python_handlers_effect_is_skipped_by_an_http_worker(drv: Driver) -> None:
    first = drv.claim_one(drv.enqueue(), "w-python")
    ctx = JobContext(drv.store, first.id, first.attempt, "w-python", first.type, drv.clock)
    assert ctx.effect(KEY, lambda: {"charge_id": "ch_py"}) == {"charge_id": "ch_py"}
    job = drv.claim_one(drv.enqueue(), W)
    status, skip = post(drv, job, "start")
    assert status == 200 and skip["decision"] == "skip" and skip["effect"]["result"] == {"charge_id": "ch_py"}


@pytest.mark.parametrize("step", ["start", "finish", "withdraw"])
def test_bad_steps_are_422_and_write_nothing(drv: Driver, step: str) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    for body, field in [
        ({"worker_id": W}, "attempt"),
        ({"worker_id": W, "attempt": True}, "attempt"),
        ({"worker_id": W, "attempt": 0}, "attempt"),
        ({"worker_id": W, "attempt": 2**31}, "attempt"),
        ({"worker_id": W, "attempt": "1"}, "attempt"),
        ({"attempt": 1}, "worker_id"),
    ]:
        r = drv.client.post(_url(job.id, KEY, step), json=body)
        assert (r.status_code, r.get_json().get("field")) == (422, field), (body, r.get_json())
    r = drv.client.post(_url(job.id, "k%00ey", step), json={"worker_id": W, "attempt": 1})
    assert (r.status_code, r.get_json()["field"]) == (422, "key")
    r = drv.client.post(_url(job.id, "k" * 256, step), json={"worker_id": W, "attempt": 1})
    assert (r.status_code, r.get_json()["field"]) == (422, "key")
    if step == "start":
        r = drv.client.post(_url(job.id, KEY, step), json={"worker_id": W, "attempt": 1, "replay_safe": "yes"})
        assert (r.status_code, r.get_json()["field"]) == (422, "replay_safe")
    assert _ledger(drv) is None and drv.store.get(job.id).status is State.RUNNING


def test_start_is_refused_unless_the_attempt_holds_the_job(drv: Driver) -> None:
    """Refused exactly as a late complete is: another worker's claim, the
    same worker's later attempt, a job in any state but running, a job that
    does not exist. Nothing reaches the ledger."""
    job = drv.claim_one(drv.enqueue(), W)
    status, body = post(drv, job, "start", worker_id="w-other")
    assert (status, body["error"]) == (409, f"job {job.id} is held by worker '{W}', not 'w-other'")
    status, body = post(drv, job, "start", attempt=2)
    assert (status, body["error"]) == (409, f"job {job.id} is on attempt 1; attempt 2 is over")
    assert _ledger(drv) is None

    # The same worker's earlier attempt, after a rescue and a new claim.
    stale = job
    current = _rescued_and_claimed(drv, job)
    assert current.attempt == 2 and current.worker_id == stale.worker_id
    status, body = post(drv, stale, "start")
    assert (status, body["error"]) == (409, f"job {job.id} is on attempt 2; attempt 1 is over")

    for state in ALL_STATES:
        if state is State.RUNNING:
            continue
        other = drv.in_state(state)
        worker = f"w{other.id}"
        r = drv.client.post(_url(other.id, f"k-{other.id}", "start"), json={"worker_id": worker, "attempt": 1})
        body = r.get_json()
        assert r.status_code == 409, (state, body)
        assert body == {
            "error": f"job {other.id} is {state.value}; only a running job's attempt can start an effect",
            "job_id": other.id,
            "status": state.value,
        }
        assert _ledger(drv, f"k-{other.id}") is None
    r = drv.client.post(_url(10**9, KEY, "start"), json={"worker_id": W, "attempt": 1})
    assert (r.status_code, r.get_json()["error"]) == (404, f"job {10**9} does not exist")
    assert _ledger(drv) is None


def test_an_unknown_outcome_sends_the_job_to_dead_in_the_start(drv: Driver) -> None:
    """The worker process died between start and finish: the retry's start
    fails its attempt, not retryable (retries left or not), as a Python
    handler's would; the person's resolve, then a retry, goes on."""
    job = drv.claim_one(drv.enqueue(max_retries=5), W)
    assert post(drv, job, "start")[1]["decision"] == "perform"
    again = _rescued_and_claimed(drv, job, "w-next")
    status, body = post(drv, again, "start")
    message = f"effect {KEY} was started by attempt 1 and its outcome is unknown"
    assert status == 409, body
    assert body["error"] == f"{message}; job {job.id} is dead" and body["status"] == "dead"
    assert (body["effect"]["state"], body["effect"]["attempt"]) == ("started", 1)
    dead = drv.store.get(job.id)
    assert dead.status is State.DEAD and dead.error == f"EffectOutcomeUnknown: {message}"
    assert [(a.attempt, str(a.outcome), a.worker_id) for a in drv.store.attempts_of(job.id)] == [
        (1, "stalled", W), (2, "failed", "w-next"),
    ]  # fmt: skip
    assert _ledger(drv).state is EffectState.STARTED and _ledger(drv).attempt == 1

    # Reported on, the dead attempt is refused like any late report.
    assert post(drv, again, "start")[0] == 409
    r = drv.client.post(f"/api/jobs/{job.id}/complete", json={"worker_id": "w-next"})
    assert r.status_code == 409

    # A person checked the gateway: it charged. Resolve, retry; the retry skips.
    r = drv.client.post(_url(job.id, KEY, "resolve"), json={"outcome": "done", "result": {"charge_id": "ch_9"}})
    assert r.status_code == 200 and r.get_json()["resolved_by"] == "api", r.get_json()
    assert drv.client.post(f"/api/jobs/{job.id}/retry", json={}).status_code == 200
    third = drv.claim_one(job, "w-third")
    status, skip = post(drv, third, "start")
    assert (status, skip["decision"], skip["effect"]["result"]) == (200, "skip", {"charge_id": "ch_9"})


def test_resolved_not_performed_the_retry_performs_it(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    post(drv, job, "start")
    again = _rescued_and_claimed(drv, job)
    assert post(drv, again, "start")[0] == 409
    r = drv.client.post(_url(job.id, KEY, "resolve"), json={"outcome": "not_performed"})
    assert r.status_code == 200
    drv.store.retry(job.id, drv.clock.advance(1))
    third = drv.claim_one(job, W)
    status, begun = post(drv, third, "start")
    assert (status, begun["decision"], begun["effect"]["attempt"]) == (200, "perform", third.attempt)


def test_a_second_start_by_the_same_attempt_is_an_unknown_outcome(drv: Driver) -> None:
    """As in ``ctx.effect``: the first start may have been performed (a
    timeout in the middle of the side effect). A start whose answer was lost
    is withdrawn first, then started again."""
    lost = drv.claim_one(drv.enqueue(max_retries=3), W)
    assert post(drv, lost, "start")[1]["decision"] == "perform"
    status, body = post(drv, lost, "withdraw")
    assert status == 200 and body["state"] == "not_performed"
    assert post(drv, lost, "start")[1]["decision"] == "perform"

    twice = drv.claim_one(drv.enqueue(max_retries=3), W)
    assert post(drv, twice, "start", key="k-twice")[1]["decision"] == "perform"
    status, body = post(drv, twice, "start", key="k-twice")
    assert status == 409 and body["status"] == "dead", body
    assert "effect k-twice was started by attempt 1 and its outcome is unknown" in body["error"]


def test_replay_safe_takes_the_unknown_key_over(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    post(drv, job, "start")
    again = _rescued_and_claimed(drv, job)
    status, begun = post(drv, again, "start", replay_safe=True)
    assert (status, begun["decision"], begun["replayed"]) == (200, "perform", True), begun
    assert (begun["effect"]["state"], begun["effect"]["attempt"]) == ("started", 2)
    # The first attempt's late report is not the key's any more.
    status, body = post(drv, job, "finish", result="late")
    assert status == 409 and "started by attempt 2" in body["error"], body
    assert post(drv, again, "finish", result="charged")[1]["result"] == "charged"
    assert drv.store.get(job.id).status is State.RUNNING


def test_withdraw_lets_the_next_attempt_perform(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    post(drv, job, "start")
    status, body = post(drv, job, "withdraw")
    assert (status, body["state"]) == (200, "not_performed")
    assert post(drv, job, "withdraw") == (200, body), "the same withdraw again"
    status, body = post(drv, job, "finish", result=1)
    assert status == 200 and body["state"] == "done", "a late done is the truth, over a withdrawal"
    status, body = post(drv, job, "withdraw")
    assert (status, body["state"]) == (409, "done") and "a done effect cannot be withdrawn" in body["error"]


def test_a_late_finish_is_the_truth_about_the_effect(drv: Driver) -> None:
    """The job was rescued while its worker was inside the side effect; the
    worker then finishes: the effect is done, and the next attempt skips it."""
    job = drv.claim_one(drv.enqueue(), W)
    post(drv, job, "start")
    later = drv.clock.advance(STALL * 2)
    assert [j.id for j in drv.store.rescue_stalled(later, STALL)] == [job.id]
    status, done = post(drv, job, "finish", result={"charge_id": "ch_late"})
    assert (status, done["state"]) == (200, "done")
    drv.clock.advance(DAY.total_seconds())
    again = drv.claim_one(job, "w-next")
    assert post(drv, again, "start")[1]["decision"] == "skip"


def test_finish_and_withdraw_only_from_the_attempt_that_started_it(drv: Driver) -> None:
    job = drv.claim_one(drv.enqueue(), W)
    post(drv, job, "start")
    for step in ("finish", "withdraw"):
        status, body = post(drv, job, step, worker_id="w-other")
        assert status == 409 and f"started by attempt 1 (worker '{W}')" in body["error"], body
        status, body = post(drv, job, step, attempt=7)
        assert status == 409 and body["state"] == "started", body
        assert post(drv, job, step, key="no-such-key")[0] == 404
    other = drv.claim_one(drv.enqueue(), "w-other")
    for step in ("finish", "withdraw"):
        status, body = post(drv, other, step)
        assert (status, body["error"]) == (404, f"effect {KEY!r} does not exist"), "another job's effect"
    assert _ledger(drv).state is EffectState.STARTED


def test_a_result_over_max_result_bytes_is_413_and_the_effect_stays_started(drv: Driver) -> None:
    from jobdeck import create_app

    small = drv.make_deck(clock=drv.clock, max_result_bytes=64)
    client = create_app(deck=small).test_client()
    job = drv.claim_one(drv.enqueue(), W)
    body = {"worker_id": W, "attempt": 1}
    assert client.post(_url(job.id, KEY, "start"), json=body).status_code == 200
    r = client.post(_url(job.id, KEY, "finish"), json={**body, "result": "x" * 100})
    assert r.status_code == 413 and "over max_result_bytes (64)" in r.get_json()["error"], r.get_json()
    assert _ledger(drv).state is EffectState.STARTED
    assert client.post(_url(job.id, KEY, "finish"), json={**body, "result": "x" * 10}).status_code == 200


def test_wait_while_another_jobs_running_attempt_holds_the_key(drv: Driver) -> None:
    holder = drv.claim_one(drv.enqueue(), "w-a")
    waiter = drv.claim_one(drv.enqueue(), "w-b")
    assert post(drv, holder, "start")[1]["decision"] == "perform"
    status, body = post(drv, waiter, "start")
    assert (status, body["decision"], body["effect"]["job_id"]) == (200, "wait", holder.id)
    post(drv, holder, "finish", result="ok")
    assert post(drv, waiter, "start")[1]["decision"] == "skip"


def test_two_jobs_starting_one_key_at_once_perform_it_once(drv: Driver) -> None:
    n = 4
    claimed = [drv.claim_one(drv.enqueue(), f"w-race-{i}") for i in range(n)]
    now = drv.clock.advance(1)

    def start(i: int) -> str:
        job = claimed[i]
        assert job.worker_id is not None
        return effects.start(drv.store, "k-race", job.id, job.attempt, job.worker_id, now).decision.value

    decisions = race(n, start)
    assert sorted(decisions) == ["perform"] + ["wait"] * (n - 1), decisions
