"""Review of 49b2fa9, hostile: ``ctx.cancelled`` (``jobdeck.worker.lease.CancelSignal``)
no longer calls ``threading.Event.__init__``: its ``Condition`` is made at
its first use (``_cond``, a property since the review's fixes). Also: ``Holdings.finish``
takes the prefetch average, ``AttemptLog.has_pending`` reads without its lock,
and a handler's ``None`` result skips ``inspect.isawaitable``.

The tests document guarantees that hold (no waiter misses a cancel, a
timed-out wait is False only when the signal was unset, every way a cancel
reaches a waiting handler, results of every kind, the prefetch average). The
review broke the first version three ways, each fixed since and kept here as
the test that found it:

- a process-wide lock made the conditions, and ``os.fork`` copied it held
  into a child forked while another thread made one: the child hung on its
  first ``wait``;
- an unmade signal pickled (``threading.Event`` refuses), so handing
  ``ctx.cancelled`` to a spawned process gave it a copy no cancel reached;
- the signal lacked the ``_flag`` that ``threading.Event.__repr__`` reads:
  ``repr(ctx.cancelled)`` raised, and a handler that formatted it failed.
"""

from __future__ import annotations

import asyncio
import copy
import os
import pickle
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.clock import since_boot
from jobdeck.core.loglines import LogLimits
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.jobs.joblogs import AttemptLog
from jobdeck.runtime import pool_for
from jobdeck.store.joblogs import lines_of
from jobdeck.worker.holdings import Holdings, Slot
from jobdeck.worker.lease import LEASE_LOST, TIMED_OUT, CancelSignal, Lease
from jobdeck.worker.pool import WorkerPool

from tests.conftest import all_in, wait_for

# -- helpers ------------------------------------------------------------------------


def _started(pool: WorkerPool, job_id: int) -> bool:
    return job_id in pool.running_jobs()


def _join_all(threads: list[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still waiting after {timeout}s: {alive}"


def _fork_and_wait(child: Callable[[], None], timeout: float = 5.0) -> int | None:
    """Fork; the child runs ``child`` under a 3 s SIGALRM (a hang ends as a
    SIGALRM death) and ``os._exit(0)``s. Returns the child's exit code, or
    ``-signal`` when a signal ended it, or None if it outlived ``timeout``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(3)
            child()
            os._exit(0)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return -os.WTERMSIG(status)
            return os.WEXITSTATUS(status)
        time.sleep(0.01)  # polling the child with a deadline
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


# -- the signal alone: races ------------------------------------------------------------


def _long_waiter(sig: CancelSignal, go: threading.Barrier, results: list[bool]) -> None:
    go.wait(5)
    results.append(sig.wait(10))


def _canceller(sig: CancelSignal, go: threading.Barrier, reason: str, yield_first: bool) -> None:
    go.wait(5)
    if yield_first:
        time.sleep(0)  # let the waiters get ahead now and then
    sig.cancel(reason)


def test_no_waiter_misses_a_cancel_that_races_the_making_of_the_condition() -> None:
    """Many rounds of waiters (long timeouts) that make the condition while
    two cancels land from other threads, some starting after them: every
    wait returns True, promptly, and one of the reasons is kept."""
    for round_ in range(150):
        sig = CancelSignal()
        results: list[bool] = []
        go = threading.Barrier(6)
        threads = [threading.Thread(target=_long_waiter, args=(sig, go, results)) for _ in range(4)]
        for reason in ("cancelled", TIMED_OUT):
            threads.append(threading.Thread(target=_canceller, args=(sig, go, reason, round_ % 3 == 0)))
        for t in threads:
            t.start()
        _join_all(threads, 5)
        assert results == [True] * 4
        assert sig.is_set() and sig.reason in ("cancelled", TIMED_OUT)
        assert sig.wait(0) is True


def _short_waiter(sig: CancelSignal, cancelled: threading.Event, violations: list[str]) -> None:
    seen_true = False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        before = cancelled.is_set()
        got = sig.wait(random.choice((0, 0.0001, 0.001)))
        if not got and (before or seen_true):
            violations.append(f"False after the cancel (before={before}, seen_true={seen_true})")
        if got:
            if seen_true:
                return
            seen_true = True


def test_a_timed_wait_is_false_only_when_the_signal_was_not_set_before_it_began() -> None:
    """Waiters with tiny timeouts, in a loop, while another thread cancels:
    a wait that began after ``cancel()`` returned must be True, and once a
    waiter saw True, every later wait is True."""
    for _ in range(60):
        sig = CancelSignal()
        cancelled = threading.Event()
        violations: list[str] = []
        threads = [threading.Thread(target=_short_waiter, args=(sig, cancelled, violations)) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(random.random() * 0.002)  # a random moment, not synchronisation
        sig.cancel("cancelled")
        cancelled.set()
        _join_all(threads, 8)
        assert violations == []


def test_is_set_and_cancel_reason_agree_for_a_handler_polling_without_waiting() -> None:
    """A handler that only polls (``is_set`` / ``check_cancelled``) never
    makes the condition, and still sees the cancel and its reason at once."""
    sig = CancelSignal()
    seen: list[tuple[bool, str | None]] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            if sig.is_set():
                seen.append((True, sig.reason))
                return

    t = threading.Thread(target=poller)
    t.start()
    sig.cancel(LEASE_LOST)
    t.join(5)
    stop.set()
    assert seen == [(True, LEASE_LOST)]


# -- the signal used as real code uses a threading.Event ------------------------------------


def test_it_passes_for_a_threading_event_wherever_one_is_checked() -> None:
    sig = CancelSignal()
    assert isinstance(sig, threading.Event)
    assert issubclass(CancelSignal, threading.Event)
    with pytest.warns(DeprecationWarning):  # as threading.Event's old name warns
        assert sig.isSet() is False


def test_asyncio_to_thread_and_a_thread_pool_waiting_on_it_wake_on_a_cancel() -> None:
    """Libraries that wait on the event from their own threads: a
    ``concurrent.futures`` pool and ``asyncio.to_thread``."""
    from concurrent.futures import ThreadPoolExecutor

    sig = CancelSignal()

    async def main() -> list[bool]:
        waiting = [asyncio.to_thread(sig.wait, 10) for _ in range(3)]
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, sig.cancel, "cancelled")
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 5))

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(sig.wait, 10) for _ in range(3)]
        started = time.monotonic()
        assert asyncio.run(main()) == [True, True, True]
        assert [f.result(timeout=5) for f in futures] == [True, True, True]
    assert time.monotonic() - started < 5


def test_a_shallow_copy_behaves_as_a_copied_threading_event_does() -> None:
    """``copy.copy`` of a ``threading.Event`` is an event with its own flag:
    the same holds here (and neither the original nor the copy breaks)."""
    sig = CancelSignal()
    dup = copy.copy(sig)
    sig.cancel("cancelled")
    assert sig.wait(0) is True and dup.is_set() is False
    dup.set()
    assert dup.wait(0) is True


def test_pickling_the_signal_is_refused_as_a_threading_events_is() -> None:
    """Found by the review (fixed): an unmade ``CancelSignal`` pickled; a ``threading.Event`` never does.

    ``threading.Event`` holds a ``Condition`` over a ``_thread.lock`` from its
    ``__init__``, so ``pickle.dumps`` raises ``TypeError: cannot pickle
    '_thread.lock' object``: a handler that passes ``ctx.cancelled`` to a
    spawned ``multiprocessing.Process``, a ``ProcessPoolExecutor.submit`` or
    any pickling transport learns at once it must use another channel. Since
    49b2fa9 a signal nothing has waited on yet has ``_made = None`` and
    pickles fine: the other process gets an independent copy that no cancel,
    timeout or lost lease ever sets, and waits its whole time out, silently.
    (Once anything waited on or set it, pickling fails again: the same call
    works or raises depending on a race.)

    Reproduce: ``pickle.loads(pickle.dumps(CancelSignal()))`` succeeds;
    cancelling the original leaves the copy unset."""
    plain = threading.Event()
    with pytest.raises(TypeError):
        pickle.dumps(plain)
    sig = CancelSignal()
    try:
        clone = pickle.loads(pickle.dumps(sig))
    except TypeError:
        return  # refused, as a threading.Event is
    sig.cancel("cancelled")
    assert clone.wait(0.05), "the pickled ctx.cancelled never sees the cancel: a waiter in another process misses it"


def test_repr_and_str_of_the_signal_work() -> None:
    """Found by the review (fixed): ``repr(ctx.cancelled)`` and ``str(ctx.cancelled)`` raised
    ``AttributeError: 'CancelSignal' object has no attribute '_flag'``.

    The commit says every method of ``threading.Event`` is overridden and
    none uses the base's private attributes, so ``threading.Event.__init__``
    need not run. But ``threading.Event`` (3.11 here, 3.11.2 and 3.11.7
    alike, and every later version) has its own ``__repr__``, which reads
    ``self._flag``; ``CancelSignal`` neither overrides it nor has ``_flag``
    (nor ``_cond``). So a handler's ``print(ctx.cancelled)``,
    ``f"{ctx.cancelled}"``, ``log.info("%s", ctx.cancelled)``, a debugger,
    ``traceback.TracebackException(..., capture_locals=True)``, an error
    reporter or a test framework that reprs locals: each raises (or, in
    ``logging``, prints a "--- Logging error ---" instead of the line).
    The pool's own ``Slot`` dataclass's generated ``__repr__`` includes its
    ``cancelled`` field, so ``repr(slot)`` raises too.

    Reproduce: ``repr(jobdeck.worker.lease.CancelSignal())``."""
    plain = threading.Event()
    sig = CancelSignal()
    missing = sorted(name for name in vars(plain) if not hasattr(sig, name))
    assert "unset" in repr(plain)
    text = repr(sig)
    assert "unset" in text and str(sig) == text
    sig.cancel("cancelled")
    assert "set" in repr(sig)
    # the pool's own Slot dataclass reprs its ``cancelled`` field (a log line, a debugger, an assertion)
    slot = Slot(None, None, 0.0, None, threading.current_thread())  # type: ignore[arg-type]
    assert "cancelled=" in repr(slot)
    assert missing == [], f"threading.Event's methods read {missing}, which a CancelSignal lacks"


@pytest.mark.backends
def test_a_handler_that_formats_ctx_cancelled_completes(make_deck, registry: Registry) -> None:
    """Found by the review (fixed; the one above, in a real pool): a handler returning
    ``f"{ctx.cancelled!r}"`` fails its attempt with ``AttributeError:
    'CancelSignal' object has no attribute '_flag'`` (before 49b2fa9 it
    completed with ``"<threading.Event at 0x...: unset>"``-like text)."""

    @registry.handler("review.reprs", max_retries=0)
    def reprs(payload: dict, ctx: JobContext) -> str:
        return f"{ctx.cancelled!r}"

    deck = make_deck()
    job = deck.enqueue("review.reprs").job
    pool = pool_for(deck, 1, heartbeat_interval=60)
    pool.start()
    try:
        wait_for(lambda: all_in(deck, [job.id], [State.COMPLETED, State.DEAD]), timeout=10, message="ended")
    finally:
        pool.stop(grace=2)
    done = deck.store.get(job.id)
    assert done.status is State.COMPLETED, f"the handler failed: {done.error}"
    assert "unset" in done.result


# -- fork -------------------------------------------------------------------------------


def test_a_child_forked_from_a_quiet_process_can_wait_and_set_a_signal() -> None:
    """With nothing making a condition at the fork, the child's signals
    (made or not before the fork) work, and ``_at_fork_reinit`` is safe."""
    unmade, made = CancelSignal(), CancelSignal()
    made.wait(0)

    def child() -> None:
        for s in (unmade, made):
            s._at_fork_reinit()
            assert s.wait(0.01) is False
            s.cancel("cancelled")
            assert s.wait(0.01) is True

    assert _fork_and_wait(child) == 0


def test_a_child_forked_while_other_threads_make_conditions_can_still_use_ctx_cancelled() -> None:
    """A process forked while other threads are making signals' conditions
    can wait on and set its own signals, made or not.

    The review broke the first version (49b2fa9): it made each condition
    under one process-wide lock, which ``os.fork`` copied held into a child
    forked while another thread was inside it, and the child's first
    ``wait(0.01)`` on an unmade signal then never returned (ended here by the
    3 s SIGALRM). The condition is now stored with an atomic
    ``dict.setdefault``: no lock of the module's is held across the making.
    Forked 20 times while four threads make and wait on new signals without
    pause."""
    sig = CancelSignal()  # the handler's ctx.cancelled, nothing waited on it yet
    stop = threading.Event()

    def maker() -> None:  # sibling threads making conditions at the fork
        while not stop.is_set():
            CancelSignal().wait(0)
            CancelSignal().set()

    threads = [threading.Thread(target=maker) for _ in range(4)]
    for t in threads:
        t.start()
    try:

        def child() -> None:
            sig._at_fork_reinit()  # what a careful forked child would do
            assert sig.wait(0.01) is False
            fresh = CancelSignal()
            fresh.cancel("cancelled")
            assert fresh.wait(0.01) is True

        statuses = [_fork_and_wait(child) for _ in range(20)]
    finally:
        stop.set()
        _join_all(threads, 5)
    assert statuses == [0] * 20, f"forked children that hung or failed (-{signal.SIGALRM}: the 3 s alarm): {statuses}"


# -- the prefetch average ------------------------------------------------------------------


def _slot(job_id: int, on_loop: bool = False) -> Slot:
    from datetime import UTC, datetime

    from jobdeck.store import JobRecord

    job = JobRecord.__new__(JobRecord)
    object.__setattr__(job, "id", job_id)
    object.__setattr__(job, "cancel_requested_at", None)
    return Slot(job, datetime.now(UTC), time.monotonic(), None, threading.current_thread(), on_loop=on_loop)


def test_the_prefetch_average_counts_only_threads_results_that_were_taken() -> None:
    """Late (timed out, released) and set-aside results and async jobs'
    waits never move the average; a result taken does, once."""
    holdings = Holdings(2, 10, sqlite=True)
    lease = Lease(30.0)
    slots = [_slot(i) for i in range(1, 5)]
    for s in slots:
        assert holdings.begin(s, lease)
    assert holdings.finish(slots[0], set_aside=False, took=2.0) is False
    assert holdings.avg_duration == 2.0
    # a timeout abandons the slot: its late result moves nothing
    slots[1].deadline = 0.0
    assert holdings.expired(time.monotonic()) == [slots[1]]
    assert slots[1].cancelled.is_set() and slots[1].cancelled.reason == TIMED_OUT
    assert holdings.finish(slots[1], set_aside=False, took=100.0) is True
    # released at the end of a stop's grace, then returned late
    released = holdings.abandon_running()
    assert {s.job.id for s in released} == {3, 4}
    assert all(s.cancelled.reason == "released at shutdown" for s in released)
    assert holdings.finish(slots[2], set_aside=False, took=100.0) is True
    assert holdings.avg_duration == 2.0
    # set aside for a lost lease
    s5 = _slot(5)
    assert holdings.begin(s5, lease)
    assert holdings.finish(s5, set_aside=True, took=100.0) is False
    assert holdings.avg_duration == 2.0
    assert holdings.has_set_aside()
    # an async job's wait is no thread's time
    s6 = _slot(6, on_loop=True)
    assert holdings.begin(s6, lease)
    assert holdings.finish(s6, set_aside=False, took=None) is False
    assert holdings.avg_duration == 2.0
    s7 = _slot(7)
    assert holdings.begin(s7, lease)
    assert holdings.finish(s7, set_aside=False, took=1.0) is False
    assert holdings.avg_duration == pytest.approx(1.9)
    # a second finish of the same slot is refused, not counted twice
    assert holdings.finish(s7, set_aside=False, took=1.0) is True
    assert holdings.avg_duration == pytest.approx(1.9)


# -- the log buffer read without its lock ---------------------------------------------------


def test_has_pending_never_misses_lines_added_before_it_is_asked_while_others_flush() -> None:
    """One thread adds lines and then asks ``has_pending`` (as the executor
    does at the end of a handler), while another takes and writes the
    buffer in a loop (as the monitor and the acker do): every line is
    written once, and whenever ``has_pending`` says False the lines added
    so far were all taken already."""
    written: list[str] = []
    lock = threading.Lock()

    def write(_log: AttemptLog, pending: Any) -> None:
        with lock:
            written.extend(line.message for line in pending.lines)

    from datetime import UTC, datetime

    buf = AttemptLog(1, 1, LogLimits(100_000, 10_000_000), lambda: datetime.now(UTC), write)
    stop = threading.Event()

    def flusher() -> None:
        while not stop.is_set():
            buf.flush()

    t = threading.Thread(target=flusher)
    t.start()
    bad: list[int] = []
    try:
        for i in range(5000):
            buf.add("info", f"line {i}")
            if not buf.has_pending():
                with lock:
                    if f"line {i}" not in written[-50:]:
                        bad.append(i)
    finally:
        stop.set()
        t.join(5)
    buf.flush()
    assert bad == []
    assert written == [f"line {i}" for i in range(5000)]


# -- real pools on real databases -------------------------------------------------------


@pytest.mark.backends
def test_cancels_through_the_http_api_wake_every_waiting_handler_at_once(make_deck, registry: Registry) -> None:
    """Four handlers in ``ctx.cancelled.wait(30)`` on four threads, each
    cancelled through ``POST /api/jobs/<id>/cancel``: each wait returns True
    within a second of its cancel, with ``cancel_reason == "cancelled"``,
    and every job ends cancelled, never retried."""
    seen: dict[int, tuple[bool, str | None, float]] = {}

    @registry.handler("review.waits", max_retries=5)
    def waits(payload: dict, ctx: JobContext) -> None:
        got = ctx.cancelled.wait(30)
        seen[ctx.job_id] = (got, ctx.cancel_reason, time.monotonic())
        ctx.check_cancelled()

    deck = make_deck()
    ids = [deck.enqueue("review.waits").job.id for _ in range(4)]
    client = create_app(deck=deck).test_client()
    pool = pool_for(deck, 4, heartbeat_interval=60)  # no beat: the local cancel alone must reach them
    pool.start()
    try:
        wait_for(lambda: all(_started(pool, i) for i in ids), message="all four handlers started")
        asked: dict[int, float] = {}
        for i in ids:
            asked[i] = time.monotonic()
            r = client.post(f"/api/jobs/{i}/cancel", json={})
            assert r.status_code == 202, r.get_data(as_text=True)
        wait_for(lambda: all_in(deck, ids, [State.CANCELLED]), timeout=10, message="all end cancelled")
    finally:
        pool.stop(grace=2)
    assert sorted(seen) == sorted(ids)
    for i in ids:
        got, reason, at = seen[i]
        assert got is True and reason == "cancelled"
        assert at - asked[i] < 2.0, f"job {i}'s handler woke {at - asked[i]:.2f}s after its cancel"
        (row,) = deck.store.attempts_of(i)
        assert row.outcome is AttemptOutcome.CANCELLED


@pytest.mark.backends
def test_a_timeout_wakes_a_handler_waiting_on_ctx_cancelled_with_its_reason(make_deck, registry: Registry) -> None:
    seen: list[tuple[bool, str | None, float]] = []

    @registry.handler("review.slow", timeout=0.4, max_retries=0)
    def slow(payload: dict, ctx: JobContext) -> str:
        started = time.monotonic()
        got = ctx.cancelled.wait(20)
        seen.append((got, ctx.cancel_reason, time.monotonic() - started))
        return "late"

    deck = make_deck()
    job = deck.enqueue("review.slow").job
    pool = pool_for(deck, 1, heartbeat_interval=60)
    pool.start()
    try:
        wait_for(lambda: seen, timeout=10, message="the handler woken by its timeout")
        wait_for(lambda: deck.store.get(job.id).status is not State.RUNNING, timeout=10, message="attempt ended")
    finally:
        pool.stop(grace=2)
    ((got, reason, took),) = seen
    assert got is True and reason == TIMED_OUT and took < 5
    assert pool.holdings.avg_duration is None or pool.holdings.avg_duration < 5, "a late result moved the average"


@pytest.mark.backends
def test_a_lost_lease_wakes_a_waiting_handler_and_its_job_is_given_back_and_run_again(
    make_deck, registry: Registry
) -> None:
    """The lease watch (no heartbeat landed for half of ``stall_timeout``)
    sets ``ctx.cancelled`` with "lease lost": a handler in ``wait(30)``
    wakes at once; its attempt is set aside, given back once a beat lands,
    and run again (attempt 2 completes)."""
    seen: list[tuple[int, bool, str | None]] = []

    @registry.handler("review.held", max_retries=0)
    def held(payload: dict, ctx: JobContext) -> str:
        if ctx.attempt > 1:
            return "second"
        got = ctx.cancelled.wait(30)
        seen.append((ctx.attempt, got, ctx.cancel_reason))
        ctx.check_cancelled()
        return "first"

    deck = make_deck(stall_timeout=6.0)
    job = deck.enqueue("review.held").job
    pool = pool_for(deck, 1, heartbeat_interval=0.3)
    pool.start()
    try:
        wait_for(lambda: _started(pool, job.id), message="the handler started")
        with pool.lease._lock:  # as if no beat had landed for a long time
            pool.lease.renewed = since_boot() - 100.0
        pool.heart.lease_watch_once()
        wait_for(lambda: seen, timeout=5, message="the handler told the lease is lost")
        done = wait_for(
            lambda: (r := deck.store.get(job.id)).status is State.COMPLETED and r, timeout=15, message="run again"
        )
    finally:
        pool.stop(grace=2)
    assert seen == [(1, True, LEASE_LOST)]
    assert done.result == "second" and done.retry_count == 0
    assert [a.outcome for a in deck.store.attempts_of(job.id)] == ["interrupted", "completed"]


class _Awaitable:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        yield from asyncio.sleep(0).__await__()
        return self.value


class _NoBool:
    def __bool__(self) -> bool:
        raise RuntimeError("bool() of a handler's result")


@pytest.mark.backends
def test_every_kind_of_result_is_stored_as_before(make_deck, registry: Registry) -> None:
    """``None``, falsy values, a coroutine or a custom awaitable from a plain
    function, an ``async def`` handler, and a result whose ``bool()`` raises
    (the skip must test ``is not None``, never truth)."""

    @registry.handler("review.none")
    def none(payload: dict, ctx: JobContext) -> None:
        return None

    @registry.handler("review.falsy")
    def falsy(payload: dict, ctx: JobContext) -> Any:
        return payload["v"]

    @registry.handler("review.coro")
    def coro(payload: dict, ctx: JobContext) -> Any:
        async def inner() -> str:
            await asyncio.sleep(0)
            return "from a coroutine"

        return inner()

    @registry.handler("review.custom_awaitable")
    def custom(payload: dict, ctx: JobContext) -> Any:
        return _Awaitable({"awaited": True})

    @registry.handler("review.async")
    async def adef(payload: dict, ctx: Any) -> str:
        await asyncio.sleep(0)
        return "async def"

    @registry.handler("review.nobool", max_retries=0)
    def nobool(payload: dict, ctx: JobContext) -> Any:
        return _NoBool()

    deck = make_deck()
    expected: dict[int, Any] = {
        deck.enqueue("review.none").job.id: None,
        deck.enqueue("review.coro").job.id: "from a coroutine",
        deck.enqueue("review.custom_awaitable").job.id: {"awaited": True},
        deck.enqueue("review.async").job.id: "async def",
    }
    for v in (0, False, "", [], {}):
        expected[deck.enqueue("review.falsy", {"v": v}).job.id] = v
    nb = deck.enqueue("review.nobool").job.id
    pool = pool_for(deck, 2, heartbeat_interval=60)
    pool.start()
    try:
        ids = [*expected, nb]
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED, State.DEAD]), timeout=15, message="all results stored")
    finally:
        pool.stop(grace=2)
    for job_id, value in expected.items():
        got = deck.store.get(job_id)
        assert got.status is State.COMPLETED, (job_id, got.status, got.error)
        assert got.result == value and type(got.result) is type(value), (job_id, got.result)
    # not JSON: a failure of the attempt, but never the executor's crash
    assert deck.store.get(nb).status in (State.DEAD, State.COMPLETED)


def _completed_by_a_pool(deck: Any, ids: list[int], timeout: float) -> WorkerPool:
    """Run a pool of 3 threads until every one of ``ids`` is completed; the stopped pool."""
    pool = pool_for(deck, 3, heartbeat_interval=60)
    pool.start()
    try:
        wait_for(lambda: all_in(deck, ids, [State.COMPLETED]), timeout=timeout, message="the jobs to complete")
    finally:
        pool.stop(grace=2)
    return pool


def test_a_drain_of_many_tiny_jobs_completes_and_sets_the_average(make_deck, registry: Registry) -> None:
    @registry.handler("review.tiny")
    def tiny(payload: dict, ctx: JobContext) -> None:
        if payload["n"] % 7 == 0:
            ctx.cancelled.wait(0)  # some make the condition, most never do
        return None

    deck = make_deck()
    ids = deck.enqueue_many([{"type": "review.tiny", "payload": {"n": n}} for n in range(300)])
    pool = _completed_by_a_pool(deck, ids, timeout=30)
    assert pool.holdings.avg_duration is not None and pool.holdings.avg_duration < 1.0


@pytest.mark.backends
def test_lines_a_handlers_own_thread_logs_before_the_handler_returns_are_all_kept(
    make_deck, registry: Registry
) -> None:
    """A handler starts a thread that logs through ``ctx.log`` while the
    monitor flushes the buffer; the handler joins it and returns: every
    line is stored on the attempt, once, in order (the end's
    ``has_pending`` is read without the buffer's lock now)."""

    @registry.handler("review.logs")
    def logs(payload: dict, ctx: JobContext) -> str:
        def chatter() -> None:
            for i in range(300):
                ctx.log("line %d", i)
                if i % 50 == 0:
                    time.sleep(0.01)  # room for the monitor's flushes

        t = threading.Thread(target=chatter)
        t.start()
        t.join(10)
        return "done"

    deck = make_deck()
    ids = [deck.enqueue("review.logs").job.id for _ in range(3)]
    _completed_by_a_pool(deck, ids, timeout=20)
    for job_id in ids:
        lines = [line.message for line in lines_of(deck.store, job_id)]
        assert lines == [f"line {i}" for i in range(300)], f"job {job_id}: {len(lines)} lines"


def test_a_process_handlers_child_event_is_set_by_a_cancel(make_deck, registry: Registry, tmp_path) -> None:
    """``executor = "process"``: the child has its own event, set through
    the pipe when the parent's ``CancelSignal`` is; ``proc.sleeps`` waits
    on it and ends, the job cancelled, well before its 60 s."""
    from tests import process_handlers

    process_handlers.register(registry)
    deck = make_deck(process_workers=1)
    job = deck.enqueue("proc.sleeps", {"seconds": 60, "pidfile": str(tmp_path / "pid")}).job
    pool = pool_for(deck, 1, heartbeat_interval=60)
    pool.start()
    try:
        wait_for(lambda: (tmp_path / "pid").exists(), timeout=20, message="the child runs the handler")
        asked = time.monotonic()
        deck.cancel(job.id, actor="review")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=10, message="ends cancelled")
        assert time.monotonic() - asked < 5
    finally:
        pool.stop(grace=2)
