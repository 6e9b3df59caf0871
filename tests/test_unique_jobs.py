"""Unique jobs (``jobdeck.jobs.unique``, ``jobdeck.store.unique``) on both databases: a
duplicate returns the kept job; the key is free again once the kept job
leaves its states or its period ends; replace and debounce change a kept job
that has not started; the UNIQUE index decides between racing enqueues in
threads and in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.records import Outcome

from tests.conftest import T0, Clock

pytestmark = pytest.mark.backends

ROOT = Path(__file__).resolve().parent.parent
ORDER = {"by": ["type", "payload.order_id"], "period": 3600}


def _run(deck: Jobdeck, job_id: int, ok: bool = True) -> None:
    """Claim ``job_id`` (it must be the only due job) and complete or fail it."""
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1)
    assert claimed.id == job_id
    outcome = Outcome(job_id, "w1", attempt=claimed.attempt, error=None if ok else "boom", retryable=ok)
    if ok:
        assert deck.store.complete_many([outcome], deck.clock()) == [job_id]
    else:
        deck.store.fail_many([outcome], deck.clock())


def _count(deck: Jobdeck) -> int:
    return sum(deck.store.counts(deck.clock()).values())


def test_a_duplicate_returns_the_kept_job(deck: Jobdeck) -> None:
    first = deck.enqueue("demo.noop", {"order_id": 7}, unique=ORDER)
    again = deck.enqueue("demo.noop", {"order_id": 7, "note": "other"}, unique=ORDER)
    other = deck.enqueue("demo.noop", {"order_id": 8}, unique=ORDER)
    assert first.created and not first.duplicate
    job, created = again  # the (job, created) callers unpack, as for idempotency keys
    assert not created and again.duplicate and not again.changed and job.id == first.job.id
    assert job.payload == {"order_id": 7}, "keep: the duplicate changes nothing"
    assert other.created and other.job.id != first.job.id
    assert first.job.unique_key == '{"payload.order_id":7,"type":"demo.noop"}'
    assert _count(deck) == 2


def test_the_api_answers_201_then_200_with_duplicate(client: Any, deck: Jobdeck) -> None:
    body = {"type": "demo.noop", "payload": {"order_id": 1}, "unique": ORDER}
    made = client.post("/api/jobs", json=body)
    dup = client.post("/api/jobs", json=body)
    from tests.openapi_check import check

    check(made, "/api/jobs", "post")
    check(dup, "/api/jobs", "post")
    refused = client.post("/api/jobs", json={**body, "unique": {"by": ["payload.nope"]}})
    assert refused.status_code == 422 and check(refused, "/api/jobs", "post")["field"] == "unique"
    assert made.status_code == 201 and "duplicate" not in made.get_json()
    assert dup.status_code == 200
    assert dup.get_json()["duplicate"] is True and dup.get_json()["replaced"] is False
    assert dup.get_json()["id"] == made.get_json()["id"]
    assert made.get_json()["unique_key"] == '{"payload.order_id":1,"type":"demo.noop"}'


def test_the_default_key_is_type_queue_and_the_whole_payload(deck: Jobdeck) -> None:
    a = deck.enqueue("demo.noop", {"x": 1, "y": [1, 2]}, unique=True)
    assert deck.enqueue("demo.noop", {"y": [1, 2], "x": 1}, unique=True).duplicate, "key order does not matter"
    assert deck.enqueue("demo.noop", {"x": 1, "y": [1, 2]}, unique=True, queue="other").created
    assert deck.enqueue("demo.noop", {"x": 2}, unique=True).created
    assert deck.enqueue("demo.report", {"x": 1, "y": [1, 2]}, unique=True).created
    assert not deck.enqueue("demo.noop", {"x": 1, "y": [1, 2]}).duplicate, "no unique, no key: a new job"
    assert a.job.unique_key is not None


def test_a_key_without_type_in_by_is_still_scoped_to_its_type(deck: Jobdeck, clock: Clock) -> None:
    """Two types keyed on the same payload field never share a key: a
    duplicate of one is never answered with, nor replaces, the other's job."""
    by = {"by": ["payload.a"], "on_duplicate": "replace"}
    noop = deck.enqueue("demo.noop", {"a": 1}, unique=by, run_at=clock() + timedelta(seconds=50))
    other = deck.enqueue("demo.fail", {"a": 1, "message": "x"}, unique=by)
    assert other.created and other.job.id != noop.job.id and other.job.type == "demo.fail"
    kept = deck.store.get(noop.job.id)
    assert kept is not None and kept.type == "demo.noop" and kept.payload == {"a": 1}
    assert deck.enqueue("demo.noop", {"a": 1}, unique=by).duplicate


def test_numerically_equal_values_make_one_key(deck: Jobdeck) -> None:
    first = deck.enqueue("demo.noop", {"n": 1, "z": 0, "f": 2.5}, unique=True)
    assert first.created
    assert deck.enqueue("demo.noop", {"n": 1.0, "z": -0.0, "f": 2.5}, unique=True).duplicate
    assert deck.enqueue("demo.noop", {"n": True, "z": 0, "f": 2.5}, unique=True).created, "true is not 1"
    assert deck.enqueue("demo.noop", {"n": 1, "z": 0, "f": 2.25}, unique=True).created
    keyed = {"by": ["payload.order"]}
    assert deck.enqueue("demo.noop", {"order": 42}, unique=keyed).created
    assert deck.enqueue("demo.noop", {"order": 42.0}, unique=keyed).duplicate


def test_the_types_config_makes_every_enqueue_unique(make_deck: Any) -> None:
    deck = make_deck(types={"demo.noop": {"unique": {"by": ["payload.order_id"], "period": 60}}})
    first = deck.enqueue("demo.noop", {"order_id": 1})
    assert deck.enqueue("demo.noop", {"order_id": 1}).duplicate
    assert deck.enqueue_many([{"type": "demo.noop", "payload": {"order_id": 1}}]) == [first.job.id]
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=False).created, "unique = false: not for this one"
    keyed = deck.enqueue("demo.noop", {"order_id": 1}, idempotency_key="explicit")
    assert keyed.created and keyed.job.unique_key is None, "an idempotency key takes the type's unique's place"
    with pytest.raises(InvalidField, match="not both"):
        deck.enqueue("demo.noop", {"order_id": 1}, idempotency_key="k2", unique=True)


def test_a_bad_types_unique_is_a_config_error_naming_the_key(make_deck: Any) -> None:
    with pytest.raises(ConfigError, match=r"types\.demo\.noop\.unique\.period"):
        make_deck(types={"demo.noop": {"unique": {"period": -1}}})
    with pytest.raises(ConfigError, match=r"types\.demo\.noop\.unique\.states"):
        make_deck(types={"demo.noop": {"unique": {"states": ["waiting"]}}})
    with pytest.raises(ConfigError, match=r"types\.demo\.noop\.unique\.debounce"):
        make_deck(types={"demo.noop": {"unique": {"debounce": 5, "states": ["pending"]}}})


def test_completion_frees_the_key(deck: Jobdeck) -> None:
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique=ORDER)
    _run(deck, first.job.id)
    assert not deck.store.get(first.job.id).holds_unique_key(deck.clock())
    again = deck.enqueue("demo.noop", {"order_id": 1}, unique=ORDER)
    assert again.created and again.job.id != first.job.id
    assert deck.store.get(first.job.id).unique_key is None, "the enqueue took the key from the completed job"
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=ORDER).job.id == again.job.id


def test_running_and_failed_hold_the_key_and_dead_frees_it(deck: Jobdeck) -> None:
    unique = {**ORDER, "states": ["pending", "running", "failed"]}
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique=unique, max_retries=1)
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1)
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=unique).job.id == first.job.id, "running holds"
    deck.store.fail_many([Outcome(first.job.id, "w1", attempt=claimed.attempt, error="x")], deck.clock())
    assert deck.store.get(first.job.id).status is State.FAILED
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=unique).duplicate, "failed holds"
    deck.clock.advance(3)  # type: ignore[attr-defined]
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1)
    deck.store.fail_many([Outcome(first.job.id, "w1", attempt=claimed.attempt, error="x")], deck.clock())
    assert deck.store.get(first.job.id).status is State.DEAD
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=unique).created, "dead is not in the states"


def test_completed_in_the_states_keeps_the_key_for_the_period(deck: Jobdeck, clock: Clock) -> None:
    unique = {**ORDER, "states": ["pending", "scheduled", "running", "completed"]}
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique=unique)
    _run(deck, first.job.id)
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=unique).job.id == first.job.id
    clock.advance(3600)
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique=unique).created, "the period has passed"


def test_the_period_is_exact(deck: Jobdeck, clock: Clock) -> None:
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique={**ORDER, "period": 10})
    clock.advance(9.999)
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique={**ORDER, "period": 10}).duplicate
    clock.advance(0.001)
    again = deck.enqueue("demo.noop", {"order_id": 1}, unique={**ORDER, "period": 10})
    assert again.created and again.job.id != first.job.id
    assert deck.store.get(first.job.id).status is State.PENDING, "the old job still runs; it lost only its key"


def test_no_period_holds_while_in_the_states(deck: Jobdeck, clock: Clock) -> None:
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique={"by": ["payload.order_id"]})
    clock.advance(10 * 365 * 86400)
    assert deck.enqueue("demo.noop", {"order_id": 1}, unique={"by": ["payload.order_id"]}).job.id == first.job.id


def test_scheduled_and_pending_are_told_apart(deck: Jobdeck, clock: Clock) -> None:
    only_due = {"by": ["payload.n"], "states": ["pending"]}
    later = deck.enqueue("demo.noop", {"n": 1}, unique=only_due, delay_seconds=60)
    now = deck.enqueue("demo.noop", {"n": 1}, unique=only_due)
    assert now.created, "a scheduled job does not hold a key whose states lack scheduled"
    assert deck.enqueue("demo.noop", {"n": 1}, unique=only_due).job.id == now.job.id
    assert deck.store.get(later.job.id).unique_key is None

    only_later = {"by": ["payload.n"], "states": ["scheduled"]}
    held = deck.enqueue("demo.noop", {"n": 2}, unique=only_later, delay_seconds=60)
    assert deck.enqueue("demo.noop", {"n": 2}, unique=only_later).job.id == held.job.id
    clock.advance(60)  # now due: pending, no longer scheduled
    assert deck.enqueue("demo.noop", {"n": 2}, unique=only_later).created


def test_replace_gives_a_kept_job_that_has_not_started_the_new_payload_and_run_at(deck: Jobdeck, clock: Clock) -> None:
    unique = {"by": ["payload.order_id"], "on_duplicate": "replace"}
    first = deck.enqueue("demo.noop", {"order_id": 1, "v": 1}, unique=unique, delay_seconds=100)
    dup = deck.enqueue("demo.noop", {"order_id": 1, "v": 2}, unique=unique, delay_seconds=5)
    assert dup.duplicate and dup.changed and dup.job.id == first.job.id
    kept = deck.store.get(first.job.id)
    assert kept.payload == {"order_id": 1, "v": 2} and kept.available_at == T0 + _s(5)
    clock.advance(5)
    (claimed,) = deck.store.claim("w1", clock(), limit=1)
    assert claimed.unique_key == first.job.unique_key and claimed.unique_states == 1 | 2 | 4 | 8, "the claim's rows too"
    late = deck.enqueue("demo.noop", {"order_id": 1, "v": 3}, unique=unique)
    assert late.duplicate and not late.changed, "running: started, so not replaced"
    assert deck.store.get(first.job.id).payload == {"order_id": 1, "v": 2}
    deck.store.release("w1", [(claimed.id, claimed.attempt)], clock())
    released = deck.enqueue("demo.noop", {"order_id": 1, "v": 4}, unique=unique)
    assert released.duplicate and not released.changed, "released: pending again, but it has been attempted"


def test_debounce_moves_the_kept_jobs_start_after_the_latest_duplicate(deck: Jobdeck, clock: Clock) -> None:
    unique = {"by": ["payload.user"], "debounce": 30}
    first = deck.enqueue("demo.noop", {"user": "u1"}, unique=unique)
    assert first.job.available_at == T0 + _s(30), "the first enqueue waits too"
    clock.advance(10)
    dup = deck.enqueue("demo.noop", {"user": "u1", "ignored": True}, unique=unique)
    assert dup.duplicate and dup.changed
    kept = deck.store.get(first.job.id)
    assert kept.available_at == T0 + _s(40) and kept.payload == {"user": "u1"}, "debounce alone keeps the payload"
    clock.advance(29)
    deck.enqueue("demo.noop", {"user": "u1"}, unique=unique)
    assert deck.store.get(first.job.id).available_at == T0 + _s(69)
    assert deck.store.claim("w1", clock(), limit=1) == [], "not due: each duplicate moved it"
    clock.advance(30)
    (claimed,) = deck.store.claim("w1", clock(), limit=1)
    assert claimed.id == first.job.id
    assert not deck.enqueue("demo.noop", {"user": "u1"}, unique=unique).changed, "started: no more debounce"
    replaced = deck.enqueue("demo.noop", {"user": "u2", "v": 1}, unique={**unique, "on_duplicate": "replace"})
    deck.enqueue("demo.noop", {"user": "u2", "v": 2}, unique={**unique, "on_duplicate": "replace"})
    assert deck.store.get(replaced.job.id).payload == {"user": "u2", "v": 2}


def test_bulk_enqueue_of_unique_jobs_makes_one_job_per_key(deck: Jobdeck) -> None:
    items = [{"type": "demo.noop", "payload": {"order_id": i % 3}, "unique": ORDER} for i in range(9)]
    ids = deck.enqueue_many([*items, {"type": "demo.noop"}])
    assert len(set(ids[:9])) == 3 and ids[:3] * 3 == ids[:9] and ids[9] not in ids[:9]
    assert deck.enqueue_many(items[:3]) == ids[:3]


def _s(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


# -- races ------------------------------------------------------------------------------


def _race_threads(make_deck: Any, n: int) -> list[Any]:
    decks = [make_deck() for _ in range(5)]  # five decks: five engines and pools, as in five processes
    gate = threading.Barrier(n)
    results: list[Any] = [None] * n

    def enqueue(i: int) -> None:
        gate.wait(timeout=30)
        results[i] = decks[i % len(decks)].enqueue("demo.noop", {"order_id": 42, "i": i}, unique=ORDER)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None for r in results), "an enqueue failed or hung"
    return results


def test_fifty_racing_threads_make_exactly_one_job(make_deck: Any) -> None:
    results = _race_threads(make_deck, 50)
    assert sum(r.created for r in results) == 1
    assert len({r.job.id for r in results}) == 1 and sum(r.duplicate for r in results) == 49
    assert _count(make_deck()) == 1


def test_fifty_racing_threads_on_a_freed_key_make_exactly_one_new_job(make_deck: Any) -> None:
    deck = make_deck()
    old = deck.enqueue("demo.noop", {"order_id": 42}, unique=ORDER)
    _run(deck, old.job.id)
    results = _race_threads(make_deck, 50)
    assert sum(r.created for r in results) == 1 and len({r.job.id for r in results}) == 1
    assert results[0].job.id != old.job.id
    assert deck.store.counts(deck.clock())["pending"] == 1


RACER = """
import json, sys, threading
from jobdeck import demo
from jobdeck.core.config import load
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry

url, threads = sys.argv[1], int(sys.argv[2])
registry = Registry()
demo.register(registry)
deck = Jobdeck(load(path=None, env={}, overrides={"database_url": url, "workers": 0}), registry)
unique = {"by": ["type", "payload.order_id"], "period": 3600}
deck.enqueue("demo.report", {}, unique=False)  # connect and warm up before the gate
print("ready", flush=True)
sys.stdin.readline()
gate = threading.Barrier(threads)
out = []

def run(i):
    gate.wait()
    r = deck.enqueue("demo.noop", {"order_id": 42, "i": i}, unique=unique)
    out.append([r.job.id, r.created, r.duplicate])

ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_fifty_racing_enqueues_in_three_processes_make_exactly_one_job(deck: Jobdeck, db_url: str) -> None:
    counts = [17, 17, 16]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, db_url, str(n)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in counts
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr and p.stderr.read()
        for p in procs:  # all three are connected and waiting: let them go together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.extend(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(results) == 50
    assert sum(created for _, created, _ in results) == 1
    assert sum(duplicate for _, _, duplicate in results) == 49 and len({job for job, _, _ in results}) == 1
    from jobdeck.store import JobFilter

    noop = deck.store.list_jobs(JobFilter(type="demo.noop", limit=100), deck.clock())
    assert len(noop) == 1 and noop[0].id == results[0][0]


def test_the_job_page_shows_the_unique_key_escaped_and_whether_it_is_held(dash: Any, deck: Jobdeck) -> None:
    plain = deck.enqueue("demo.noop", {})
    html = dash.get(f"/jobs/{plain.job.id}").get_data(as_text=True)
    assert "Unique key" not in html, "shown only when set"
    deck.store.discard(plain.job.id, deck.clock())
    made = deck.enqueue("demo.noop", {"order_id": "<b>x</b>"}, unique=ORDER)
    html = dash.get(f"/jobs/{made.job.id}").get_data(as_text=True)
    assert "Unique key" in html and "<b>x</b>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "held until" in html
    _run(deck, made.job.id)
    html = dash.get(f"/jobs/{made.job.id}").get_data(as_text=True)
    assert "released: the next enqueue of it makes a new job" in html


def test_bulk_enqueues_sharing_keys_in_opposite_orders_neither_deadlock_nor_double(make_deck: Any) -> None:
    decks = [make_deck(), make_deck()]
    rounds, keys = 15, 8
    gate = threading.Barrier(2)
    errors: list[BaseException] = []
    got: list[list[list[int]]] = [[], []]

    def run(side: int) -> None:
        try:
            for r in range(rounds):
                order = range(keys) if side == 0 else reversed(range(keys))
                items = [{"type": "demo.noop", "payload": {"order_id": f"{r}-{k}"}, "unique": ORDER} for k in order]
                gate.wait(timeout=30)
                ids = decks[side].enqueue_many(items)
                got[side].append(ids if side == 0 else ids[::-1])
        except BaseException as exc:  # reported below: a deadlock shows as the other side's barrier timeout
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=run, args=(side,)) for side in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert got[0] == got[1], "both sides got the same job for every key"
    assert _count(decks[0]) == rounds * keys


def test_the_cli_says_a_duplicate_is_one(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from jobdeck.cli import main

    from tests.test_cli import jobdeck_env

    config = tmp_path / "jobdeck.toml"
    config.write_text('[types."demo.noop"]\nunique = { by = ["payload.order_id"], period = 60 }\n')
    env = jobdeck_env(tmp_path, JOBDECK_CONFIG=str(config))
    runner = CliRunner()
    args = ["enqueue", "demo.noop", "--payload", '{"order_id": 5}', "--demo", "--create"]
    first = runner.invoke(main, args, env=env)
    again = runner.invoke(main, args, env=env)
    assert first.exit_code == 0 and "a duplicate: job" not in first.output, first.output
    assert again.exit_code == 0 and "a duplicate: job" in again.output and "already existed" not in again.output


def test_an_operators_retry_back_into_the_states_keeps_the_key(deck: Jobdeck) -> None:
    unique = {**ORDER, "states": ["pending", "running"]}
    first = deck.enqueue("demo.noop", {"order_id": 1}, unique=unique, max_retries=0)
    _run(deck, first.job.id, ok=False)
    assert deck.store.get(first.job.id).status is State.DEAD
    deck.store.retry(first.job.id, deck.clock())
    again = deck.enqueue("demo.noop", {"order_id": 1}, unique=unique)
    assert again.duplicate and again.job.id == first.job.id, "pending again before anyone took the key"


@pytest.mark.slow
def test_the_sql_and_the_job_page_agree_on_who_holds_a_key(deck: Jobdeck, clock: Clock) -> None:
    """``jobdeck.store.unique.holding`` (what frees a key) and
    ``JobRecord.holds_unique_key`` (what the job page says), over every
    state, due or not, inside and past the period, and several masks."""
    from jobdeck.jobs.unique import STATE_BITS
    from jobdeck.store.models import jobs
    from jobdeck.store.unique import holding
    from sqlalchemy import select, update

    made = deck.enqueue("demo.noop", {"order_id": 1}, unique=ORDER).job
    now = clock()
    masks = [STATE_BITS["pending"], STATE_BITS["scheduled"], 1 | 2 | 4 | 8, 16 | 32 | 64 | 128, 255]
    checked = 0
    for state in State:
        for at in (now - _s(1), now, now + _s(1)):
            for until in (None, now + _s(1), now, now - _s(1)):
                for mask in masks:
                    with deck.store.write() as conn:
                        conn.execute(
                            update(jobs)
                            .where(jobs.c.id == made.id)
                            .values(status=state.value, available_at=at, unique_until=until, unique_states=mask)
                        )
                    with deck.store.read() as conn:
                        in_sql = conn.execute(select(holding(now)).where(jobs.c.id == made.id)).scalar_one()
                    job = deck.store.get(made.id)
                    assert bool(in_sql) == job.holds_unique_key(now), (state, at > now, until, mask)
                    checked += 1
    assert checked == len(State) * 3 * 4 * len(masks)


def test_a_replace_recomputes_the_kept_jobs_flow_keys(make_deck: Any, clock: Clock) -> None:
    """The new payload decides the per-key limits too: a replaced job must not
    keep counting under the customer its old payload named."""
    flow = {"concurrency": 1, "concurrency_key": "payload.customer", "rate": "100/1s", "rate_key": "payload.account"}
    deck = make_deck(clock=clock, types={"demo.noop": flow})
    by = {"by": ["payload.order"], "on_duplicate": "replace"}
    first = deck.enqueue("demo.noop", {"order": 1, "customer": "c1", "account": "a1"}, unique=by)
    again = deck.enqueue("demo.noop", {"order": 1, "customer": "c2", "account": "a2"}, unique=by)
    assert again.duplicate and again.changed and again.job.id == first.job.id
    kept = deck.store.get(first.job.id)
    assert (kept.payload["customer"], kept.concurrency_key, kept.rate_key) == ("c2", '"c2"', '"a2"')
