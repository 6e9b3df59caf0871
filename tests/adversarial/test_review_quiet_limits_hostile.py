"""Hostile tests of ca544be: the quiet claim of a policy whose limits the
last claims did not meet (``QueueControls.holding_back``,
``controls._Claim.unless_limited``, ``claim_statements._claim_unless``).

The claimed guarantee: a limit is never exceeded, jobs are claimed in claim
order exactly as the limit-aware claim would, no job is claimed twice,
nothing accepted is lost. Real threads, several decks (one policy each, as
several processes have), real PostgreSQL and SQLite files."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy.exc
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.runtime import pool_for
from jobdeck.store import JobRecord, Outcome, controls
from jobdeck.store.models import jobs
from sqlalchemy import func, select, text

from tests.conftest import all_in, wait_for
from tests.helpers import completions

pytestmark = [pytest.mark.backends, pytest.mark.adversarial]

POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def _noop(payload: Any, ctx: Any) -> None:
    return None


def _register(registry: Any, *names: str) -> None:
    for name in names:
        registry.handler(name)(_noop)


def _running(deck: Jobdeck, *, type: str | None = None, queue: str | None = None) -> int:
    stmt = select(func.count()).select_from(jobs).where(jobs.c.status == State.RUNNING.value)
    if type is not None:
        stmt = stmt.where(jobs.c.type == type)
    if queue is not None:
        stmt = stmt.where(jobs.c.queue == queue)
    with deck.store.read() as conn:
        return int(conn.execute(stmt).scalar_one())


def _statuses(deck: Jobdeck) -> dict[str, int]:
    with deck.store.read() as conn:
        return {s: int(n) for s, n in conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))}


def _quiet(deck: Jobdeck, worker: str = "warm", check: bool = True) -> None:
    """Make ``deck``'s policy quiet: one claim of a plain job it takes alone."""
    noop, _ = deck.enqueue("demo.noop", priority=100)
    got = deck.store.claim(worker, datetime.now(UTC), limit=1)
    assert [j.id for j in got] == [noop.id]
    deck.store.complete_many(completions(got, worker), datetime.now(UTC))
    if check:
        assert not deck.queues.holding_back(), "the warm-up claim left the policy quiet"


# -- 1. many policies and threads, limits under pressure ---------------------------------------


def test_limits_hold_and_no_job_is_claimed_twice_with_many_quiet_policies_racing(
    make_deck: Callable[..., Jobdeck], registry: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three decks (three processes' policies), two claimer threads each,
    claim a mix of plain jobs, jobs of a limited type, jobs in a limited
    queue and jobs of both, with random priorities and some becoming due
    during the run. After every claim the running jobs of the limited type
    and queue are counted in the database: never over the limit. Each job
    is claimed exactly once and every job ends completed."""
    _register(registry, "t.lim")
    quiet_took = [0]
    unless = controls._Claim.unless_limited

    def counted(*args: Any, **kwargs: Any) -> Any:
        got = unless(*args, **kwargs)
        quiet_took[0] += bool(got)
        return got

    monkeypatch.setattr(controls._Claim, "unless_limited", counted)
    limits = {"types": {"t.lim": {"concurrency": 2}}, "queues": {"slow": {"concurrency": 1}}}
    decks = [make_deck(**limits) for _ in range(3)]
    for d in decks:
        _quiet(d)
    rnd = random.Random(7)
    specs: list[dict[str, Any]] = []
    for i in range(400):
        kind = rnd.choice(["plain"] * 9 + ["lim", "slow", "both"])
        spec: dict[str, Any] = {
            "type": "t.lim" if kind in ("lim", "both") else "demo.noop",
            "priority": rnd.choice([0, 0, 1, 5]),
        }
        if kind in ("slow", "both"):
            spec["queue"] = "slow"
        if i % 7 == 0 or kind != "plain":
            spec["delay_seconds"] = rnd.choice([0.05, 0.2, 0.5, 1.0, 1.5])
        specs.append(spec)
    all_ids = [decks[0].enqueue(s.pop("type"), **s)[0].id for s in specs]
    claims: dict[int, list[str]] = {}
    violations: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 90

    def claimer(deck: Jobdeck, worker: str, seed: int) -> None:
        r = random.Random(seed)
        held: list[JobRecord] = []
        try:
            while time.monotonic() < deadline:
                got = deck.store.claim(worker, datetime.now(UTC), limit=r.choice([1, 2, 3]))
                n_type, n_queue = _running(deck, type="t.lim"), _running(deck, queue="slow")
                with lock:
                    for j in got:
                        claims.setdefault(j.id, []).append(worker)
                    if n_type > 2:
                        violations.append(f"{n_type} t.lim running after {worker}'s claim of {[j.id for j in got]}")
                    if n_queue > 1:
                        violations.append(f"{n_queue} running in slow after {worker}'s claim of {[j.id for j in got]}")
                # complete what the previous round held: jobs overlap across claims
                if held:
                    deck.store.complete_many(completions(held, worker), datetime.now(UTC))
                held = got
                if not got and all_in(deck, all_ids, [State.COMPLETED]):
                    return
                if not got:
                    time.sleep(0.005)  # a claimer's poll, inside a deadline
        except BaseException as exc:
            errors.append(exc)
        finally:
            if held:
                deck.store.complete_many(completions(held, worker), datetime.now(UTC))

    threads = [
        threading.Thread(target=claimer, args=(d, f"w{i}-{k}", i * 10 + k), daemon=True)
        for i, d in enumerate(decks)
        for k in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not violations, violations[:5]
    twice = {i: w for i, w in claims.items() if len(w) > 1}
    assert not twice, f"claimed more than once: {dict(list(twice.items())[:5])}"
    assert all_in(decks[0], all_ids, [State.COMPLETED]), _statuses(decks[0])
    if backend == "postgres":
        assert quiet_took[0] > 0, "no quiet claim took jobs: the new path was not attacked"


# -- 2. claim order under concurrency (PostgreSQL) -----------------------------------------------


def _order_race(
    make_deck: Callable[..., Jobdeck], registry: Any, monkeypatch: pytest.MonkeyPatch, quiet: bool = True
) -> tuple[list[str], dict[str, int]]:
    """Four decks (policies), one claimer thread each, drain plain jobs of
    priority 0 while a producer enqueues one job of a limited type (a limit
    never full: 1000) at priority 10 at a time, waiting for it to be
    claimed before the next. Every claim step (the quiet claim and the
    limit-aware claim) is timed. Returned: each case where a step that
    began after a limited job was committed took a priority-0 job, and the
    limited job (due, its limit far from full, first in claim order) was
    then taken by a step that began only after that one had ended. Under
    one serialized limit-aware claim this cannot happen. A step begins when
    its claimer reads the claim's ``now``: a job enqueued after that is not
    due for it (first written, the harness timed the step from the policy's
    call, and counted such claims as out of order)."""
    _register(registry, "t.lim")
    limits = {"types": {"t.lim": {"concurrency": 1000}}}
    decks = [make_deck(**limits) for _ in range(4)]
    for d in decks:
        _quiet(d, check=quiet)
    steps: list[tuple[str, float, float, list[tuple[int, int]]]] = []
    lock = threading.Lock()
    unless, pipelined = controls._Claim.unless_limited, controls._Claim.pipelined

    asked = threading.local()
    """The claimer's time just before it read the claim's ``now``: a job enqueued after it is not due for that claim."""

    def timed(kind: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = asked.at
            got = fn(*args, **kwargs)
            end = time.monotonic()
            with lock:
                steps.append((kind, start, end, [(j.id, j.priority) for j in got]))
            return got

        return run

    monkeypatch.setattr(controls._Claim, "unless_limited", timed("quiet", unless))
    monkeypatch.setattr(controls._Claim, "pipelined", timed("limit-aware", pipelined))
    decks[0].enqueue_many([{"type": "demo.noop", "priority": 0}] * 4000)
    stop = threading.Event()
    errors: list[BaseException] = []
    committed: dict[int, float] = {}

    def claimer(deck: Jobdeck, worker: str) -> None:
        try:
            while not stop.is_set():
                asked.at = time.monotonic()
                got = deck.store.claim(worker, datetime.now(UTC), limit=2)
                if got:
                    deck.store.complete_many(completions(got, worker), datetime.now(UTC))
                else:
                    time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(d, f"w{i}"), daemon=True) for i, d in enumerate(decks)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 40
        for _ in range(150):
            if time.monotonic() > deadline or errors:
                break
            job, _ = decks[0].enqueue("t.lim", priority=10)
            committed[job.id] = time.monotonic()
            wait_for(lambda jid=job.id: decks[0].store.get(jid).status != State.PENDING.value, timeout=20,
                     message=f"limited job {job.id} claimed")  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    took: dict[int, tuple[str, float, float]] = {}
    for kind, start, end, got in steps:
        for job_id, _ in got:
            if job_id in committed:
                took[job_id] = (kind, start, end)
    found: list[str] = []
    for kind, start, end, got in steps:
        low = [i for i, p in got if p == 0]
        if not low:
            continue
        for lim_id, at in committed.items():
            if lim_id not in took or at >= start:
                continue
            by_kind, by_start, _ = took[lim_id]
            if by_start > end:
                found.append(
                    f"{kind} step [{start:.4f}, {end:.4f}] took priority-0 jobs {low} while limited job {lim_id} "
                    f"(priority 10, committed at {at:.4f}) waited; a {by_kind} step begun at {by_start:.4f} took it"
                )
    kinds = {k: sum(1 for s in steps if s[0] == k) for k in ("quiet", "limit-aware")}
    return found, kinds


@POSTGRES_ONLY
def test_a_quiet_claim_never_takes_lower_jobs_past_a_due_limited_job_with_room(
    make_deck: Callable[..., Jobdeck], registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by this review: the quiet claim's CTE locked the jobs it picked
    (FOR UPDATE SKIP LOCKED) even when it then refused them for a limited
    job among them; another policy's claim running meanwhile skipped those
    and took the jobs behind them. A limited job first in claim order, with
    room under its limit, then waited while lower-priority jobs were
    claimed past it (9 to 20 claims a run). The quiet claim now reads the
    head of the line without a lock and locks nothing when it refuses."""
    found, kinds = _order_race(make_deck, registry, monkeypatch)
    assert kinds["quiet"] > 0 and kinds["limit-aware"] > 0, kinds
    assert not found, f"{len(found)} claims out of claim order ({kinds}); first: {found[:3]}"


@POSTGRES_ONLY
def test_control_the_same_race_with_every_claim_limit_aware_keeps_the_order(
    make_deck: Callable[..., Jobdeck], registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: the same workload with the quiet claim
    switched off (``Blocked.quiet`` always False: every claim takes the
    lock and the counts, as before ca544be). The order holds."""
    monkeypatch.setattr(controls.Blocked, "quiet", lambda self, paused: False)
    found, kinds = _order_race(make_deck, registry, monkeypatch, quiet=False)
    assert kinds["quiet"] == 0 and kinds["limit-aware"] > 0, kinds
    assert not found, f"{len(found)} claims out of claim order ({kinds}); first: {found[:3]}"


# -- 3. stale quiet state, heads of the line ---------------------------------------------------------


def test_a_limited_queue_job_of_an_unlimited_type_first_by_available_at_is_taken_in_its_turn(
    make_deck: Callable[..., Jobdeck], clock: Any
) -> None:
    """A queue's limit on a job whose type is unlimited, first in line by
    available_at (same priority): a quiet claim takes it first and the rest
    in order; the second job of the queue waits. Then another process fills
    the queue's limit: the first, still quiet, must leave the queue alone."""
    limits = {"queues": {"slow": {"concurrency": 1}}}
    first, second = make_deck(clock=clock, **limits), make_deck(clock=clock, **limits)
    _quiet_at(first, clock)
    a, _ = first.enqueue("demo.noop", queue="slow")
    clock.advance(1)
    b, _ = first.enqueue("demo.noop", queue="slow")
    clock.advance(1)
    n1, _ = first.enqueue("demo.noop")
    got = first.store.claim("w1", clock(), limit=3)
    assert [j.id for j in got] == [a.id, n1.id]
    assert first.store.get(b.id).status == State.PENDING.value
    first.store.complete_many(completions(got, "w1"), clock())
    more, _ = first.enqueue("demo.noop")
    got = first.store.claim("w1", clock(), limit=1)
    assert [j.id for j in got] == [b.id]
    first.store.complete_many(completions(got, "w1"), clock())
    got = first.store.claim("w1", clock(), limit=5)
    assert [j.id for j in got] == [more.id]
    first.store.complete_many(completions(got, "w1"), clock())
    assert not first.queues.holding_back(), "no queue job left: quiet again"
    # the second process fills the queue's limit; the first still believes itself quiet
    c, _ = first.enqueue("demo.noop", queue="slow")
    d, _ = first.enqueue("demo.noop", queue="slow")
    assert [j.id for j in second.store.claim("w2", clock(), limit=1)] == [c.id]
    n2, _ = first.enqueue("demo.noop")
    got = first.store.claim("w1", clock(), limit=5)
    assert [j.id for j in got] == [n2.id]
    assert first.store.get(d.id).status == State.PENDING.value
    assert _running(first, queue="slow") == 1
    assert first.queues.holding_back(), "it found the queue full"


def test_a_job_of_a_limited_type_in_a_limited_queue_counts_against_both(
    make_deck: Callable[..., Jobdeck], clock: Any, registry: Any
) -> None:
    """Type limit 2, queue limit 1; jobs of the type in the queue and out of
    it, at the head of the line. From quiet: one job of the queue, the
    type's second slot to a job outside the queue, the rest in claim order."""
    _register(registry, "t.lim")
    deck = make_deck(clock=clock, types={"t.lim": {"concurrency": 2}}, queues={"slow": {"concurrency": 1}})
    _quiet_at(deck, clock)
    both1, _ = deck.enqueue("t.lim", queue="slow", priority=9)
    both2, _ = deck.enqueue("t.lim", queue="slow", priority=9)
    lim_only, _ = deck.enqueue("t.lim", priority=8)
    lim_extra, _ = deck.enqueue("t.lim", priority=8)
    slow_plain, _ = deck.enqueue("demo.noop", queue="slow", priority=7)
    plain, _ = deck.enqueue("demo.noop", priority=1)
    got = deck.store.claim("w", clock(), limit=10)
    assert [j.id for j in got] == [both1.id, lim_only.id, plain.id]
    for j in (both2, lim_extra, slow_plain):
        assert deck.store.get(j.id).status == State.PENDING.value
    assert deck.queues.holding_back()


def _quiet_at(deck: Jobdeck, clock: Any) -> None:
    noop, _ = deck.enqueue("demo.noop", priority=100)
    got = deck.store.claim("warm", clock(), limit=1)
    assert [j.id for j in got] == [noop.id]
    deck.store.complete_many(completions(got, "warm"), clock())
    assert not deck.queues.holding_back()


# -- 4. paused limited queues, restricted claims ----------------------------------------------------


def test_a_paused_limited_queue_at_the_head_is_left_alone_and_claimed_under_its_limit_on_resume(
    make_deck: Callable[..., Jobdeck], clock: Any
) -> None:
    """A limited queue paused, its jobs first in line: quiet claims take
    the others; resumed, its jobs come in claim order, one at a time."""
    deck = make_deck(clock=clock, queues={"slow": {"concurrency": 1}})
    _quiet_at(deck, clock)
    deck.queues.set_paused("slow", True, clock(), "test")
    s1, _ = deck.enqueue("demo.noop", queue="slow", priority=9)
    s2, _ = deck.enqueue("demo.noop", queue="slow", priority=9)
    n1, _ = deck.enqueue("demo.noop")
    got = deck.store.claim("w", clock(), limit=5)
    assert [j.id for j in got] == [n1.id]
    assert not deck.queues.holding_back(), "a paused queue alone holds nothing back"
    deck.queues.set_paused("slow", False, clock(), "test")
    n2, _ = deck.enqueue("demo.noop")
    got = deck.store.claim("w", clock(), limit=5)
    assert [j.id for j in got] == [s1.id, n2.id]
    assert deck.store.get(s2.id).status == State.PENDING.value
    assert _running(deck, queue="slow") == 1


def test_a_claim_restricted_to_types_and_queues_is_quiet_about_limits_it_does_not_serve(
    make_deck: Callable[..., Jobdeck], clock: Any, registry: Any
) -> None:
    """Limited jobs first in line of a type the claimer does not serve and
    of a queue it does not serve: they neither block it nor get taken; a
    claimer serving them then takes one of each in its turn."""
    _register(registry, "t.lim")
    deck = make_deck(clock=clock, types={"t.lim": {"concurrency": 1}}, queues={"slow": {"concurrency": 1}})
    _quiet_at(deck, clock)
    lim, _ = deck.enqueue("t.lim", priority=9)
    lim2, _ = deck.enqueue("t.lim", priority=9)
    slow, _ = deck.enqueue("demo.noop", queue="slow", priority=9)
    n1, _ = deck.enqueue("demo.noop")
    n2, _ = deck.enqueue("demo.noop")
    got = deck.store.claim("w", clock(), limit=1, types=["demo.noop"], queues=["default"])
    assert [j.id for j in got] == [n1.id]
    got = deck.store.claim("w", clock(), limit=5, types=["t.lim", "demo.noop"])
    assert [j.id for j in got] == [lim.id, slow.id, n2.id]
    assert deck.store.get(lim2.id).status == State.PENDING.value
    assert deck.store.claim("w", clock(), limit=5, types=["t.lim"]) == []


# -- 5. workflows, retries, snoozes ---------------------------------------------------------------------


def test_a_workflow_step_of_a_limited_type_made_due_by_a_completion_is_claimed_under_its_limit(
    make_deck: Callable[..., Jobdeck], clock: Any, registry: Any
) -> None:
    """Two workflows whose second steps are of a type limited to 1. Their
    first steps complete; a quiet policy's claims take one limited step,
    the other waits; plain jobs go on around them."""
    _register(registry, "t.lim")
    deck = make_deck(clock=clock, types={"t.lim": {"concurrency": 1}})
    _quiet_at(deck, clock)
    wfs = [
        deck.workflow(f"wf{i}").add("a", "demo.noop").add("b", "t.lim", depends_on=["a"]).enqueue() for i in range(2)
    ]
    firsts = deck.store.claim("w", clock(), limit=2)
    assert sorted(j.id for j in firsts) == sorted(wf.jobs["a"] for wf in wfs)
    deck.store.complete_many(completions(firsts, "w"), clock())
    plain, _ = deck.enqueue("demo.noop")
    got = deck.store.claim("w", clock(), limit=5)
    steps = [wf.jobs["b"] for wf in wfs]
    assert [j.id for j in got if j.type == "t.lim"] == [steps[0]] and plain.id in [j.id for j in got]
    assert deck.store.get(steps[1]).status == State.PENDING.value
    deck.store.complete_many(completions([j for j in got if j.type == "t.lim"], "w"), clock())
    assert [j.id for j in deck.store.claim("w", clock(), limit=5)] == [steps[1]]


def test_a_failed_and_a_snoozed_job_of_a_limited_type_come_back_under_the_limit(
    make_deck: Callable[..., Jobdeck], clock: Any, registry: Any
) -> None:
    """A job of a limited type fails (retry due later) and another snoozes;
    when both come due they are claimed one at a time, in claim order, by
    a policy that has been quiet meanwhile."""
    _register(registry, "t.lim")
    deck = make_deck(clock=clock, types={"t.lim": {"concurrency": 1}})
    _quiet_at(deck, clock)
    a, _ = deck.enqueue("t.lim", max_retries=3)
    [ja] = deck.store.claim("w", clock(), limit=1)
    deck.store.fail_many([Outcome(ja.id, "w", attempt=ja.attempt, started_at=ja.claimed_at, error="boom")], clock())
    b, _ = deck.enqueue("t.lim")
    [jb] = deck.store.claim("w", clock(), limit=5)
    assert jb.id == b.id
    deck.store.snooze_many([Outcome(jb.id, "w", attempt=jb.attempt, started_at=jb.claimed_at, snooze=1.0)], clock())
    for _ in range(3):  # quiet claims meanwhile
        n, _ = deck.enqueue("demo.noop")
        got = deck.store.claim("w", clock(), limit=1, types=["demo.noop"])
        assert [j.id for j in got] == [n.id]
        deck.store.complete_many(completions(got, "w"), clock())
    clock.advance(3600)
    n, _ = deck.enqueue("demo.noop")
    got = deck.store.claim("w", clock(), limit=5)
    limited = [j for j in got if j.type == "t.lim"]
    assert len(limited) == 1, [(j.id, j.type) for j in got]
    assert n.id in [j.id for j in got]
    assert _running(deck, type="t.lim") == 1


# -- 6. hostile names ------------------------------------------------------------------------------------

HOSTILE_TYPES = [
    "t.quote'single",
    't.quote"double',
    "t.comma,brace{}[]()",
    "t.back\\slash\\\\",
    "t.%s%(x)s:name?$1",
    "t.ünïcødé-日本語-😀",
    "t." + "L" * 198,
]
HOSTILE_QUEUES = ["q'x", 'q"x', "q,x{y}", "q\\x", "q%s:y$1", "q-ünï-😀", "q" * 100]


def test_hostile_limited_names_are_bound_and_the_limits_hold(
    make_deck: Callable[..., Jobdeck], clock: Any, registry: Any
) -> None:
    """Limits of 1 on types and queues named with quotes, commas, braces,
    backslashes, placeholders, unicode and the longest allowed names. A
    policy made quiet picks one job of each at the head of the line: it
    takes exactly one of each, in claim order; another process then finds
    every limit full, and the first, still believing itself quiet after
    the others end, never takes a second of any."""
    _register(registry, *HOSTILE_TYPES)
    limits = {
        "types": {t: {"concurrency": 1} for t in HOSTILE_TYPES},
        "queues": {q: {"concurrency": 1} for q in HOSTILE_QUEUES},
    }
    first, second = make_deck(clock=clock, **limits), make_deck(clock=clock, **limits)
    assert set(first.queues.limits.types) == set(HOSTILE_TYPES)
    _quiet_at(first, clock)
    _quiet_at(second, clock)
    by_type = {t: [first.enqueue(t, priority=5)[0].id for _ in range(2)] for t in HOSTILE_TYPES}
    by_queue = {q: [first.enqueue("demo.noop", queue=q, priority=5)[0].id for _ in range(2)] for q in HOSTILE_QUEUES}
    plain, _ = first.enqueue("demo.noop")
    got = [j.id for j in first.store.claim("w1", clock(), limit=100)]
    want = [ids[0] for ids in by_type.values()] + [ids[0] for ids in by_queue.values()] + [plain.id]
    assert sorted(got) == sorted(want)
    for t in HOSTILE_TYPES:
        assert _running(first, type=t) == 1, t
    for q in HOSTILE_QUEUES:
        assert _running(first, queue=q) == 1, q
    # The second process, quiet before the first filled every limit: it takes only the plain job
    assert not second.queues.holding_back()
    p2, _ = second.enqueue("demo.noop")
    assert [j.id for j in second.store.claim("w2", clock(), limit=100)] == [p2.id]
    for t in HOSTILE_TYPES:
        assert _running(first, type=t) == 1, t
    for q in HOSTILE_QUEUES:
        assert _running(first, queue=q) == 1, q


# -- 7. a real pool --------------------------------------------------------------------------------------


def test_two_real_pools_drain_a_mix_with_limits_of_one_never_exceeded(
    make_deck: Callable[..., Jobdeck], registry: Any, backend: str
) -> None:
    """Two decks (two processes' policies), a pool of four threads each,
    drain plain jobs, jobs of a type limited to 1, jobs in a queue limited
    to 1 and jobs of both, in waves (a quiet drain, then limited jobs, then
    quiet again). The handlers record how many run at once: never more than
    one of the type, nor of the queue; every job completes once."""
    lock = threading.Lock()
    now_t = {"n": 0, "most": 0}
    now_q = {"n": 0, "most": 0}
    runs: dict[int, int] = {}

    def tracked(payload: Any, ctx: Any) -> None:
        kind_t = payload.get("t", False)
        kind_q = payload.get("q", False)
        with lock:
            runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
            for on, c in ((kind_t, now_t), (kind_q, now_q)):
                if on:
                    c["n"] += 1
                    c["most"] = max(c["most"], c["n"])
        try:
            threading.Event().wait(0.01)
        finally:
            with lock:
                for on, c in ((kind_t, now_t), (kind_q, now_q)):
                    if on:
                        c["n"] -= 1

    registry.handler("t.lim")(tracked)
    registry.handler("t.free")(tracked)
    limits = {"types": {"t.lim": {"concurrency": 1}}, "queues": {"slow": {"concurrency": 1}}}
    decks = [make_deck(**limits) for _ in range(2)]
    pools = [pool_for(d, 4) for d in decks]
    ids: list[int] = []

    def wave(kinds: list[str], n: int) -> list[int]:
        batch = []
        for i in range(n):
            kind = kinds[i % len(kinds)]
            spec: dict[str, Any] = {"type": "t.lim" if kind in ("lim", "both") else "t.free",
                                    "payload": {"t": kind in ("lim", "both"), "q": kind in ("slow", "both")},
                                    "priority": i % 3}  # fmt: skip
            if kind in ("slow", "both"):
                spec["queue"] = "slow"
            batch.append(spec)
        made = decks[0].enqueue_many(batch)
        ids.extend(made)
        return made

    for p in pools:
        p.start()
    try:
        first = wave(["plain"], 200)
        wait_for(lambda: all_in(decks[0], first, [State.COMPLETED]), timeout=60, message="the quiet drain")
        second = wave(["plain", "lim", "plain", "slow", "both", "plain"], 60)
        wait_for(lambda: all_in(decks[0], second, [State.COMPLETED]), timeout=90, message="the limited wave")
        third = wave(["plain"], 200)
        wait_for(lambda: all_in(decks[0], third, [State.COMPLETED]), timeout=60, message="the last drain")
    finally:
        for p in pools:
            p.stop(grace=5)
    assert now_t["most"] == 1, f"{now_t['most']} jobs of the limited type ran at once"
    assert now_q["most"] == 1, f"{now_q['most']} jobs of the limited queue ran at once"
    again = {i: n for i, n in runs.items() if n > 1}
    assert not again, f"jobs run more than once: {again}"
    assert all_in(decks[0], ids, [State.COMPLETED])


# -- 8. the quiet claim's connection killed ---------------------------------------------------------------


def _schema(deck: Jobdeck) -> str:
    name = deck.store.engine.url.query.get("application_name")
    assert isinstance(name, str) and name
    return name


@POSTGRES_ONLY
@pytest.mark.parametrize("how", ["terminate", "cancel"])
def test_a_quiet_claim_whose_backend_is_killed_mid_statement_loses_nothing(
    make_deck: Callable[..., Jobdeck], clock: Any, how: str
) -> None:
    """The quiet claim (autocommit, no advisory lock) waits on a table lock
    another session holds on ``jobs``; its backend is terminated (or its
    statement cancelled) there. The claim raises a SQLAlchemy error, no job
    is left running, and the next claim of the same deck takes the jobs in
    claim order (the policy, quiet or not, still holds the limit)."""
    from tests.pgtest import admin_engine

    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    _quiet_at(deck, clock)
    n1, _ = deck.enqueue("demo.noop")
    n2, _ = deck.enqueue("demo.noop")
    s1, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    s2, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    schema = _schema(deck)
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["result"] = deck.store.claim("w", clock(), limit=2)
        except BaseException as exc:
            got["error"] = exc

    holder = admin_engine()
    admin = admin_engine()
    thread = threading.Thread(target=run, daemon=True)
    try:
        with holder.connect() as lock_conn:
            lock_conn.execute(text(f'LOCK TABLE "{schema}".jobs IN EXCLUSIVE MODE'))
            thread.start()

            def waiting() -> int | None:
                with admin.connect() as c:
                    return c.execute(
                        text("SELECT pid FROM pg_stat_activity WHERE application_name = :n AND wait_event_type = 'Lock' "
                             "AND query ILIKE '%UPDATE%'"),
                        {"n": schema},
                    ).scalar()  # fmt: skip

            pid = wait_for(waiting, timeout=10, message="the claim waiting on the table lock")
            with admin.connect() as c:
                fn = "pg_terminate_backend" if how == "terminate" else "pg_cancel_backend"
                assert c.execute(text(f"SELECT {fn}(:p)"), {"p": pid}).scalar() is True
            thread.join(timeout=10)
            lock_conn.rollback()
    finally:
        holder.dispose()
        admin.dispose()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert "result" not in got or got["result"] == [], f"answered {got.get('result')} though its backend was {how}d"
    if "error" in got:
        assert isinstance(got["error"], sqlalchemy.exc.SQLAlchemyError), repr(got["error"])
    assert _running(deck) == 0, _statuses(deck)
    claimed = deck.store.claim("w", clock(), limit=5)
    assert [j.id for j in claimed] == [n1.id, n2.id, s1.id]
    assert deck.store.get(s2.id).status == State.PENDING.value


def test_an_empty_type_list_claims_nothing_quiet_or_not(make_deck: Callable[..., Jobdeck], clock: Any) -> None:
    """``types=[]`` (a pool serving nothing here): the quiet claim's IN list
    is empty; nothing is claimed, nothing raises, and the next claim with
    types takes the jobs in order under the limit."""
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    _quiet_at(deck, clock)
    n, _ = deck.enqueue("demo.noop")
    s1, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    s2, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    assert deck.store.claim("w", clock(), limit=5, types=[]) == []
    assert deck.store.claim("w", clock(), limit=5, queues=[]) == []
    assert [j.id for j in deck.store.claim("w", clock(), limit=5, types=["demo.noop", "demo.sleep"])] == [n.id, s1.id]
    assert deck.store.get(s2.id).status == State.PENDING.value


@POSTGRES_ONLY
def test_control_an_empty_type_list_through_the_limit_aware_claim_alone(
    make_deck: Callable[..., Jobdeck], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: with the quiet claim switched off (every
    claim limit-aware, as before ca544be), ``types=[]`` on PostgreSQL fails
    as well (in ``picked``'s due read): the empty IN list is a bug older
    than ca544be, which only moved where PostgreSQL meets it first."""
    monkeypatch.setattr(controls.Blocked, "quiet", lambda self, paused: False)
    deck = make_deck(clock=clock, types={"demo.sleep": {"concurrency": 1}})
    n, _ = deck.enqueue("demo.noop")
    assert deck.store.claim("w", clock(), limit=5, types=[]) == []
    assert deck.store.claim("w", clock(), limit=5, queues=[]) == []
    assert [j.id for j in deck.store.claim("w", clock(), limit=5, types=["demo.noop"])] == [n.id]
