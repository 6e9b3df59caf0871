"""``jobdeck.testing``: a handler run through a real pool on a throwaway
SQLite file, with a clock that moves only when told; effects, logs,
snooze, cancel and artifacts are read back from the database."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.handles import current_deck, use_deck
from jobdeck.testing import HandlerTest, TestClock


@pytest.fixture
def reg() -> Registry:
    return Registry()


def test_a_run_shows_what_the_handler_did(reg: Registry) -> None:
    performed: list[str] = []

    @reg.handler("billing.charge", max_retries=2, backoff_base=10)
    def charge(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        ctx.log("charging %s", payload["order_id"])
        receipt = ctx.effect(f"charge:{payload['order_id']}", lambda: performed.append("x") or {"id": "ch_1"})
        ctx.artifact("receipt.txt", b"paid")
        if ctx.attempt == 1:
            raise ConnectionError("reply lost")
        return receipt

    with HandlerTest(reg, now=datetime(2031, 5, 6, tzinfo=UTC)) as jobs:
        folder = Path(jobs.deck.config.instance_path).parent
        assert folder.exists() and jobs.clock() == datetime(2031, 5, 6, tzinfo=UTC)
        first = jobs.run(charge, order_id=7)
        assert (first.status, first.job.retry_count) == (State.FAILED, 1)
        assert first.error is not None and first.error.startswith("ConnectionError: reply lost")
        assert first.effects["charge:7"].state == "done" and first.artifacts == {"receipt.txt": b"paid"}
        assert jobs.wait(first.job).status is State.FAILED, "the clock stands still: the retry waits"
        jobs.clock.advance(minutes=1)
        second = jobs.wait(first.job)
        assert second.status is State.COMPLETED and second.result == {"id": "ch_1"}
        skipped = "effect charge:7 already done (job 1 attempt 1); skipping"
        assert second.logs == ["charging 7", "charging 7", skipped] and performed == ["x"], "the effect once"
        assert [a.outcome for a in second.attempts] == ["failed", "completed"]
    assert not folder.exists(), "the throwaway database is deleted"


def test_snooze_cancel_and_an_async_handler(reg: Registry) -> None:
    @reg.handler("t.later")
    def later(payload: dict[str, Any], ctx: JobContext) -> int:
        if ctx.attempt < 2:
            ctx.snooze(120, "not yet")
        return ctx.attempt

    began = threading.Event()

    @reg.handler("t.slow")
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.log("started")
        began.set()
        await asyncio.sleep(30)

    with HandlerTest(reg) as jobs:
        snoozed = jobs.run(later)
        assert (snoozed.status, snoozed.snoozed) == (State.PENDING, 120.0)
        jobs.clock.advance(119)
        assert jobs.wait(snoozed.job).snoozed == 120.0, "not due yet: not run again"
        jobs.clock.advance(1)
        done = jobs.wait(snoozed.job)
        assert (done.status, done.result, done.snoozed, done.job.retry_count) == (State.COMPLETED, 2, None, 0)

        job = jobs.start(slow)
        jobs.wait_running(job)
        # Running in the database is not yet running in the loop: a cancel that
        # came first (seen beside a CPU hog) ends the job before its first line.
        assert began.wait(10), "the handler's first line ran"
        jobs.cancel(job)
        cancelled = jobs.wait(job)
        assert cancelled.status is State.CANCELLED and cancelled.logs == ["started"]


def test_handles_enqueue_into_the_test_deck_and_a_stuck_job_times_out(reg: Registry) -> None:
    gate = threading.Event()

    @reg.handler("t.child")
    def child(payload: dict[str, Any], ctx: JobContext) -> int:
        return int(payload["n"]) + 1

    @reg.handler("t.parent")
    def parent(payload: dict[str, Any], ctx: JobContext) -> int:
        return child.enqueue(n=payload["n"]).job.id  # no deck named: the test's

    @reg.handler("t.stuck")
    def stuck(payload: dict[str, Any], ctx: JobContext) -> str:
        gate.wait(10)
        return "freed"

    outside = object()
    use_deck(outside)  # type: ignore[arg-type]
    try:
        with HandlerTest(reg) as jobs:
            assert current_deck() is jobs.deck
            child_id = jobs.run(parent, n=41).result
            assert jobs.wait(child_id).result == 42
            job = jobs.start(stuck)
            with pytest.raises(TimeoutError, match=r"\(t\.stuck\) is still running after 0\.3 s"):
                jobs.wait(job, timeout=0.3)
            gate.set()
            assert jobs.wait(job).result == "freed"
        assert current_deck() is outside, "the deck named before is named again"
    finally:
        use_deck(None)


def test_the_results_rule_and_typed_payloads_hold_here_too(reg: Registry) -> None:
    @reg.handler("t.when")
    def when(payload: dict[str, Any], ctx: JobContext) -> object:
        return {"at": ctx.attempt, "now": datetime.now(UTC)}

    with HandlerTest(reg) as jobs:
        run = jobs.run("t.when", {}, max_retries=3)
        assert run.status is State.DEAD and run.job.retry_count == 0
        assert run.error is not None and run.error.startswith('ResultNotJSON: result["now"]: datetime is not JSON')


def test_the_clock_is_aware_and_moves_only_when_told() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        TestClock(datetime(2030, 1, 1))
    clock = TestClock()
    start = clock()
    assert clock() == start and clock.advance(90, minutes=1) == start.replace(minute=2, second=30)


def test_a_config_that_is_refused_leaves_no_folder_behind(reg: Registry, tmp_path: Path, monkeypatch) -> None:
    from jobdeck.core.config import ConfigError

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    outside = object()  # not None: an earlier test in this process may have left its deck named
    before = use_deck(outside)  # type: ignore[arg-type]
    try:
        with pytest.raises(ConfigError, match="no_such_key"):
            HandlerTest(reg, no_such_key=1)
        assert current_deck() is outside, "a deck that could not be built is never named"
    finally:
        use_deck(before)
    assert list(tmp_path.iterdir()) == [], "the throwaway folder is deleted when the deck cannot be built"
