"""The pure "why is it waiting?" decision (jobdeck.jobs.waiting): each reason, and the
order they are checked in, on hand-built situations."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from jobdeck.core.states import State
from jobdeck.jobs.waiting import Pool, Situation, WaitingReasons, situation, waiting_reason
from jobdeck.store import JobRecord
from jobdeck.store.waiting import PoolRow, RunningGroup, WaitingReads

from tests.conftest import T0

FREE_POOL = Pool("pool-1", threads=4, running=1, healthy=True)


def a_job(**values) -> JobRecord:
    fields = dict(
        id=1, type="demo.report", queue="reports", payload={}, priority=0, status=State.PENDING, attempt=0,
        retry_count=0, max_retries=3, idempotency_key=None, available_at=T0, claimed_at=None, heartbeat_at=None,
        worker_id=None, error=None, result=None, progress=None, progress_message=None, created_at=T0,
        updated_at=T0, finished_at=None,
    )  # fmt: skip
    fields.update(values)
    return JobRecord(**fields)


def clear(**values) -> Situation:
    """A situation in which a due job of a registered type is claimed next."""
    fields = dict(
        now=T0, stall_timeout=30.0, paused=frozenset(), queue_limits={}, type_limits={}, running_by_queue={},
        running_by_type={}, pools=(FREE_POOL,), local_types=frozenset({"demo.report"}), http_types=frozenset(),
    )  # fmt: skip
    fields.update(values)
    return Situation(**fields)


def code(job: JobRecord, s: Situation) -> str | None:
    reason = waiting_reason(job, s)
    return None if reason is None else reason["code"]


def test_a_due_job_with_a_free_worker_is_not_waiting_for_anything():
    assert waiting_reason(a_job(), clear()) is None
    assert waiting_reason(a_job(status=State.FAILED, retry_count=1), clear()) is None


@pytest.mark.parametrize("status", [State.RUNNING, State.COMPLETED, State.DEAD, State.DISCARDED])
def test_only_a_claimable_job_can_be_waiting(status):
    assert waiting_reason(a_job(status=status), clear(paused=frozenset({"reports"}), pools=())) is None


def test_a_paused_queue():
    reason = waiting_reason(a_job(), clear(paused=frozenset({"reports"})))
    assert reason == {"code": "queue_paused", "message": "Queue reports is paused", "queue": "reports"}
    assert waiting_reason(a_job(queue="default"), clear(paused=frozenset({"reports"}))) is None


def test_the_queue_limit_names_the_queue_and_its_count():
    s = clear(queue_limits={"reports": 1}, running_by_queue={"reports": 1})
    assert waiting_reason(a_job(), s) == {
        "code": "concurrency_limit",
        "message": "Queue reports is at its concurrency limit (1 of 1 running)",
        "scope": "queue", "name": "reports", "running": 1, "limit": 1,
    }  # fmt: skip
    assert waiting_reason(a_job(), replace(s, running_by_queue={"reports": 0})) is None


def test_the_type_limit_names_the_type_and_its_count():
    s = clear(type_limits={"demo.report": 2}, running_by_type={"demo.report": 2})
    reason = waiting_reason(a_job(), s)
    assert reason is not None and (reason["scope"], reason["name"], reason["running"], reason["limit"]) == (
        "type", "demo.report", 2, 2,
    )  # fmt: skip
    assert reason["message"] == "Type demo.report is at its concurrency limit (2 of 2 running)"
    assert waiting_reason(a_job(), replace(s, running_by_type={"demo.report": 1})) is None


def test_the_queue_limit_is_named_before_the_type_limit():
    s = clear(
        queue_limits={"reports": 1}, running_by_queue={"reports": 1},
        type_limits={"demo.report": 1}, running_by_type={"demo.report": 1},
    )  # fmt: skip
    assert waiting_reason(a_job(), s)["scope"] == "queue"  # type: ignore[index]


def test_scheduled_and_retrying_say_when():
    later = T0 + timedelta(minutes=5)
    assert waiting_reason(a_job(available_at=later), clear()) == {
        "code": "scheduled", "message": "Scheduled for 2026-01-01 12:05:00 UTC", "at": "2026-01-01T12:05:00Z",
    }  # fmt: skip
    retry = waiting_reason(a_job(status=State.FAILED, retry_count=1, available_at=later), clear())
    assert retry == {
        "code": "retry_backoff",
        "message": "Retrying at 2026-01-01 12:05:00 UTC",
        "at": "2026-01-01T12:05:00Z",
    }


def test_no_live_pool_for_a_registered_type():
    reason = waiting_reason(a_job(), clear(pools=()))
    assert reason is not None and reason["code"] == "no_worker" and reason["external"] is False
    assert reason["message"] == "No live worker: no worker pool has heart-beaten in the last 30 s"
    sick = waiting_reason(a_job(), clear(pools=(replace(FREE_POOL, healthy=False),)))
    assert sick is not None and sick["code"] == "no_worker" and "unhealthy" in sick["message"]


def test_an_external_type_needs_an_http_worker_seen_serving_it():
    job = a_job(type="pdf.render")
    reason = waiting_reason(job, clear())
    assert reason == {
        "code": "no_worker",
        "message": "No live worker: no HTTP worker has worked a pdf.render job in the last 30 s",
        "type": "pdf.render", "external": True,
    }  # fmt: skip
    assert waiting_reason(job, clear(http_types=frozenset({"pdf.render"}))) is None


def test_every_slot_taken_is_all_workers_busy():
    full = (replace(FREE_POOL, running=4), Pool("pool-2", threads=2, running=2, healthy=True))
    reason = waiting_reason(a_job(), clear(pools=full))
    assert reason == {
        "code": "workers_busy", "message": "All workers are busy (6 of 6 slots taken on 2 workers)",
        "workers": 2, "slots": 6,
    }  # fmt: skip
    sick_but_free = (*full, Pool("pool-3", threads=4, running=0, healthy=False))
    assert code(a_job(), clear(pools=sick_but_free)) == "workers_busy"  # an unhealthy pool claims nothing
    assert waiting_reason(a_job(), clear(pools=(full[0], replace(full[1], running=1)))) is None
    # An HTTP worker's slots are its own: an external type served is not "busy".
    assert waiting_reason(a_job(type="pdf.render"), clear(pools=full, http_types=frozenset({"pdf.render"}))) is None


def test_the_reasons_in_order():
    """A job held back by everything at once gives each reason in turn as the
    ones before it are lifted."""
    job = a_job(available_at=T0 + timedelta(hours=1))
    s = clear(
        paused=frozenset({"reports"}),
        queue_limits={"reports": 1}, running_by_queue={"reports": 1},
        type_limits={"demo.report": 1}, running_by_type={"demo.report": 1},
        pools=(),
    )  # fmt: skip
    seen = []
    for lift in (
        {"paused": frozenset()},
        {"queue_limits": {}},
        {"type_limits": {}},
        {"now": T0 + timedelta(hours=2)},
        {"pools": (replace(FREE_POOL, running=4),)},
        {"pools": (FREE_POOL,)},
    ):
        reason = waiting_reason(job, s)
        seen.append(None if reason is None else reason.get("scope", reason["code"]))
        s = replace(s, **lift)
    seen.append(code(job, s))
    assert seen == ["queue_paused", "queue", "type", "scheduled", "no_worker", "workers_busy", None]


def test_the_situation_folds_the_reads():
    cutoff_ok, stale = T0 - timedelta(seconds=10), T0 - timedelta(seconds=60)
    reads = WaitingReads(
        running=[
            RunningGroup("reports", "demo.report", "pool-1", 2, cutoff_ok),
            RunningGroup("default", "demo.noop", "pool-1", 1, cutoff_ok),
            RunningGroup("default", "pdf.render", "http-1", 1, cutoff_ok),  # a live HTTP worker
            RunningGroup("default", "ocr.scan", "http-2", 1, stale),  # a silent one
            RunningGroup("default", "demo.noop", "pool-old", 1, cutoff_ok),  # a stale pool's job
        ],
        pools=[PoolRow("pool-1", 4, cutoff_ok, None), PoolRow("pool-old", 4, stale, None), PoolRow("sick", 2, T0, "x")],
        recently_finished_types=frozenset({"mail.send"}),
    )
    s = situation(
        reads, now=T0, stall_timeout=30, paused=frozenset({"q"}), queue_limits={}, type_limits={},
        local_types=frozenset({"demo.report", "demo.noop"}),
        external_types=frozenset({"pdf.render", "ocr.scan", "mail.send", "never.seen"}),
    )  # fmt: skip
    assert s.running_by_queue == {"reports": 2, "default": 4}
    assert s.running_by_type == {"demo.report": 2, "demo.noop": 2, "pdf.render": 1, "ocr.scan": 1}
    assert s.pools == (Pool("pool-1", 4, 3, True), Pool("sick", 2, 0, False))
    assert s.http_types == frozenset({"pdf.render", "mail.send"})


def test_the_reads_are_made_once_and_only_for_a_claimable_job():
    loads = []

    def load() -> Situation:
        loads.append(1)
        return clear(paused=frozenset({"reports"}))

    reasons = WaitingReasons(load)
    assert reasons.of(a_job(status=State.COMPLETED)) is None and loads == []
    assert [reasons.of(a_job(id=i))["code"] for i in range(3)] == ["queue_paused"] * 3  # type: ignore[index]
    assert loads == [1]
