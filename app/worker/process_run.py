"""One job on the process executor, driven from the executor thread that
claimed it: the parent keeps the claim, the heartbeats, the outcome and
every database write; the child (``jobdeck.worker.child``) runs the handler.

While the child runs, this thread answers its messages (logs, progress, the
context's calls) and, every ``TICK``, enforces what a thread cannot:

- the type's ``timeout``: SIGTERM, then SIGKILL after a short grace; the job
  fails "timed out after N s; worker process killed";
- ``memory_limit``: ``RLIMIT_AS`` in the child (an allocation past it raises
  ``MemoryError`` there) and a watch of its resident memory from here; either
  fails the job, not retried, "exceeded memory_limit 256 MiB (peak N MiB)";
- a cancel: ``ctx.cancelled`` is set in the child; one that ignores it is
  killed after ``cancel_grace`` (or at its timeout, if that comes first);
- a slot given up (released at the end of a stop's grace): killed at once.

A child that dies (a segfault, ``os._exit``, the OOM killer) fails its job
with how it ended ("worker process exited with signal 11 (SIGSEGV)"), and
one that could not read a message of ours says so and ends, failing its job
at once; the pool replaces every child that was killed or died.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import time
import warnings
from collections.abc import Collection
from typing import Any

from jobdeck.core.errors import Cancelled
from jobdeck.core.states import AttemptOutcome
from jobdeck.jobs.context import JobContext
from jobdeck.jobs.handlers import HandlerSpec
from jobdeck.jobs.snooze import Snooze
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.effect_records import storable
from jobdeck.worker.holdings import Slot
from jobdeck.worker.lease import LEASE_LOST
from jobdeck.worker.processes import ChildProcess, ProcessPool

TICK = 0.05
"""Seconds between this thread's looks at the child (timeout, memory, cancel)."""
MIB = 1024 * 1024
START_LIMIT = 120.0
"""Seconds a child may take to start a job's handler (a fresh child imports its modules first)."""


class ChildFailure(Exception):
    """A process job's attempt failed: the child's exception, or the child
    killed or dead. Carries what ``Executors.failed`` would read off a local
    exception: the first line, the traceback, the classes' names for
    ``non_retryable``, and whether no retry can fix it."""

    def __init__(
        self,
        line: str,
        traceback: str | None = None,
        names: Collection[str] = (),
        *,
        never: bool = False,
        kind: str = AttemptOutcome.FAILED,
    ) -> None:
        super().__init__(line)
        self.line = line
        self.child_traceback = traceback
        self.names = frozenset(names)
        self.never = never
        self.kind = kind

    def fill(self, outcome: Outcome, spec: HandlerSpec | None, listed: Collection[str]) -> None:
        outcome.error = self.line
        outcome.traceback = self.child_traceback
        outcome.kind = self.kind
        outcome.retryable = (
            spec is not None and not self.never and not (self.names & set(spec.non_retryable).union(listed))
        )


def mib(size: int) -> str:
    return f"{size / MIB:.0f} MiB"


def run_in_child(
    pool: ProcessPool,
    slot: Slot,
    ctx: JobContext,
    spec: HandlerSpec,
    *,
    memory_limit: int | None,
    cancel_grace: float,
) -> Any:
    """Run ``slot``'s job in a child of ``pool``: its result, or the failure raised."""
    job = slot.job
    child = pool.acquire(job.id, lambda: slot.abandoned or slot.cancelled.is_set())
    if child is None:
        if slot.cancelled.is_set() and slot.cancelled.reason != LEASE_LOST:
            raise Cancelled(job.id)
        raise ChildFailure("no worker process was free before the attempt was given up")
    replace: str | None = None
    try:
        result, replace = _drive(child, slot, ctx, spec, memory_limit, cancel_grace)
        return result
    except BaseException as failure:  # a Cancelled too: the child killed for it is replaced for it
        replace = replace or getattr(failure, "replace", None)
        raise
    finally:
        pool.release(child, replace)


def _job_message(job: JobRecord, spec: HandlerSpec, worker_id: str, memory_limit: int | None) -> dict[str, Any]:
    fn = spec.fn
    target = getattr(fn, "__wrapped__", fn)
    return {
        "id": job.id, "attempt": job.attempt, "retries": job.retry_count, "type": job.type,
        "worker_id": worker_id, "payload": json.dumps(job.payload), "memory_limit": memory_limit,
        "module": getattr(target, "__module__", "?"), "qualname": getattr(target, "__qualname__", repr(target)),
    }  # fmt: skip


def _killed(child: ChildProcess, line: str, replace: str, **kw: Any) -> ChildFailure:
    child.kill()
    failure = ChildFailure(line, **kw)
    failure.replace = replace  # type: ignore[attr-defined]
    return failure


def _drive(
    child: ChildProcess, slot: Slot, ctx: JobContext, spec: HandlerSpec, limit: int | None, cancel_grace: float
) -> tuple[Any, str | None]:
    job = slot.job
    # The timeout counts from the handler's start in the child: a child still
    # starting up (a fresh one imports its handler modules) has START_LIMIT.
    deadline: float | None = time.monotonic() + START_LIMIT
    kill_at: float | None = None
    started = False
    peak = 0
    child.conn.send(("job", _job_message(job, spec, ctx.worker_id, limit)))
    while True:
        if child.conn.poll(TICK):
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                raise _killed(child, child.ended(), "crash") from None
            if message[0] == "started":
                started = True
                deadline = time.monotonic() + spec.timeout if spec.timeout else None
                continue
            ended = _answer(child, ctx, message, limit, peak)
            if ended is not None:
                return ended
            continue
        now = time.monotonic()
        if limit:
            rss = child.rss()
            peak = max(peak, rss)
            if rss > limit:
                raise _killed(child, f"exceeded memory_limit {mib(limit)} (peak {mib(peak)})", "memory", never=True)
        if slot.abandoned:  # timed out or released by a stop: no late result, and nothing left running
            raise _killed(child, "the attempt was given up; worker process killed", "released")
        if slot.cancelled.is_set() and kill_at is None:
            child.conn.send(("cancel", job.id, slot.cancelled.reason))
            kill_at = now + cancel_grace
            if deadline is not None:
                kill_at = min(kill_at, deadline)
        if deadline is not None and now >= deadline:
            line = (
                f"timed out after {spec.timeout:g} s; worker process killed"
                if started
                else f"the worker process did not start the handler within {START_LIMIT:g} s; killed"
            )
            raise _killed(child, line, "timeout", kind=AttemptOutcome.TIMED_OUT)
        if kill_at is not None and now >= kill_at:
            if slot.cancelled.reason == LEASE_LOST:
                raise _killed(child, f"{LEASE_LOST}; worker process killed", "cancel")
            child.kill()
            pool_cancel = Cancelled(job.id)
            pool_cancel.replace = "cancel"  # type: ignore[attr-defined]
            raise pool_cancel


def _answer(
    child: ChildProcess, ctx: JobContext, message: tuple[Any, ...], limit: int | None, peak: int
) -> tuple[Any, str | None] | None:
    """Act on one message of the child: the job's end returns (result, replace)."""
    kind = message[0]
    if kind == "log":
        ctx.log(message[2], level=message[1])
    elif kind == "progress":
        ctx.progress(message[1], message[2])
    elif kind == "call":
        _call(child, ctx, message[1], message[2], message[3])
    elif kind == "done":
        return json.loads(message[1]), None
    elif kind == "unreadable":  # the child lost a message of ours and ends (``Child.unreadable``)
        line = f"the worker process could not read a message from the pool ({message[1]}); worker process replaced"
        raise _killed(child, line, "crash")
    elif kind == "snooze":
        raise Snooze(message[1], message[2])
    elif kind == "error":
        info, child_peak = message[1], message[2]
        if info["cancelled"]:
            raise Cancelled(ctx.job_id)
        if info["memory"] and limit:
            failure = ChildFailure(
                f"exceeded memory_limit {mib(limit)} (peak {mib(max(peak, child_peak))})",
                info["traceback"], never=True,
            )  # fmt: skip
            failure.replace = "memory"  # type: ignore[attr-defined]
            raise failure
        raise ChildFailure(info["line"], info["traceback"], info["names"], never=info["never"])
    return None


def _call(child: ChildProcess, ctx: JobContext, call_id: int, name: str, args: tuple[Any, ...]) -> None:
    """The child asked for something only the parent may do (a database write)."""
    try:
        value: Any
        if name == "artifact":
            value = ctx.artifact(*args)  # its ArtifactInfo, as a thread's handler gets
        elif name == "rate_limited":
            with contextlib.suppress(Snooze):  # the limit is closed; the child raises its own RateLimited
                ctx.rate_limited(*args)
            value = None
        elif name == "dependency_results":
            value = ctx.dependency_results()
        elif name == "batch_id":
            value = ctx.batch_id
        elif name == "once":
            with warnings.catch_warnings():  # the child warned its handler already
                warnings.simplefilter("ignore", DeprecationWarning)
                value = ctx.once(args[0])
        elif name == "effect_begin":
            value = effect_begin(ctx, *args)
        elif name == "effect_withdraw":
            ctx.store.ledger.withdraw(args[0], ctx.job_id, ctx.attempt, ctx._clock())
            value = None
        elif name == "effect_done":
            key, text = args
            stored = storable(json.loads(text))
            ctx._record_done(key, stored)
            value = json.loads(stored)
        else:
            raise LookupError(f"the worker process asked for {name!r}, which the parent does not do")
        child.conn.send(("reply", call_id, True, value))
    except Exception as exc:
        child.conn.send(("reply", call_id, False, portable(exc)))


def portable(exc: Exception) -> Exception | str:
    """``exc`` if the child can rebuild it, else its line. An error whose
    ``__init__`` wants more than its message pickles, but unpickling it
    raised in the child's pipe reader, which died: the handler waited for
    its answer until the job's timeout killed the child, or forever."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return f"{type(exc).__name__}: {exc}"
    return exc


def effect_begin(ctx: JobContext, key: str, replay_safe: bool) -> tuple[str, Any]:
    """The first phase of ``ctx.effect`` for a child: ("skip", result) or
    ("perform", None), waiting as a thread's would for another attempt."""
    from jobdeck.jobs.effects import Decision

    waited_until = time.monotonic() + ctx.EFFECT_WAIT
    pause = 0.02
    while True:
        begun = ctx._begin_effect(key, replay_safe)
        decision = ctx._decided(key, begun, waited_until)
        if decision is Decision.SKIP:
            return "skip", begun.record.result
        if decision is Decision.PERFORM:
            return "perform", None
        time.sleep(pause)  # another process's attempt holds the key; nothing here to wake on
        pause = min(0.5, pause * 2)
