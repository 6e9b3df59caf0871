"""What a handler gets besides its payload: ``JobContext``, the ``ctx`` of
``def handler(payload, ctx)``.

The worker builds one per attempt (``jobdeck.worker.executors``); a test
may build one alone from a store and a claimed job. Users import it from
``jobdeck`` or ``jobdeck.jobs.handlers``, which re-export it."""

from __future__ import annotations

import inspect
import json
import threading
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from jobdeck.core.errors import Cancelled, EffectInProgress, EffectNotPerformed
from jobdeck.jobs import effects
from jobdeck.jobs.artifacts import (
    ArtifactData,
    check_content_type,
    check_name,
    default_content_type,
    read_data,
)
from jobdeck.jobs.effects import Decision
from jobdeck.jobs.joblogs import AttemptLog, JobLog
from jobdeck.jobs.snooze import Snooze
from jobdeck.store.effect_records import storable

if TYPE_CHECKING:
    from jobdeck.store import Store
    from jobdeck.store.artifacts import ArtifactInfo

__all__ = ["JobContext"]


class JobContext:
    """What a handler gets besides its payload."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        attempt: int,
        worker_id: str,
        job_type: str,
        clock: Callable[[], datetime] | None = None,
        cancelled: threading.Event | None = None,
        log: AttemptLog | None = None,
        retries: int = 0,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt = attempt
        """The claim's number, 1, 2, ...: it fences this attempt's results. A
        claim given back before its handler started (a pool shedding what it
        prefetched, a stop) keeps its number, so a job's first run can be
        attempt 2: count runs with ``retries``."""
        self.retries = retries
        """How many earlier runs of this job failed and were retried: 0 on
        the first run, whatever claims were given back unstarted before it."""
        self.worker_id = worker_id
        self.type = job_type
        self.log = JobLog(job_type, log)
        """The attempt's log (``jobdeck.jobs.joblogs``): ``ctx.log("copied %d rows", n)``,
        ``ctx.log("slow", level="warning")`` or ``ctx.log.warning(...)``. Kept
        with the job per attempt (the pool passes ``log``, its buffer) and
        sent to the logger ``jobdeck.job.<type>`` too."""
        self._clock = clock or (lambda: datetime.now(UTC))
        self.cancelled = cancelled if cancelled is not None else threading.Event()
        """Set when the job is cancelled while this attempt runs (the pool
        sets it). A long handler waits on it instead of sleeping
        (``ctx.cancelled.wait(5)`` returns True at once on a cancel) or calls
        ``check_cancelled`` between steps. A handler that ignores it runs on
        until its timeout; either way the job ends ``cancelled``."""
        self.trace: Any = None
        """The attempt's span with tracing on (``jobdeck.tracing.AttemptSpan``): each effect is a child span."""

    @property
    def cancel_reason(self) -> str | None:
        """Why ``cancelled`` is set: ``"cancelled"`` (a person or the API:
        the job ends cancelled), ``"lease lost"`` (this process lost touch
        with the database for half of ``stall_timeout``: another process may
        soon run the job, so stop; the attempt is given back, not failed,
        ``jobdeck.worker.lease``), or None while it is not set."""
        return getattr(self.cancelled, "reason", None) if self.cancelled.is_set() else None

    MAX_RATE_LIMITED = 7 * 24 * 3600.0

    def rate_limited(self, seconds: float) -> NoReturn:
        """The downstream answered 429: close this job's rate limits (for its
        key, if keyed; its type when it has none) for ``seconds`` in every
        process, then raise ``RateLimited`` (``jobdeck.jobs.flow``). Nothing of the
        limit is claimed until then::

            if response.status_code == 429:
                ctx.rate_limited(float(response.headers.get("Retry-After", 30)))
        """
        from jobdeck.jobs.flow import Flow, Limits, RateLimited
        from jobdeck.jobs.flow_claim import FlowClaim

        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= self.MAX_RATE_LIMITED
        ):
            raise ValueError(
                f"rate_limited: seconds must be a number in (0, {self.MAX_RATE_LIMITED:g}], got {seconds!r}"
            )
        flow_claim = getattr(self.store.claim_policy, "flow_claim", None)
        if not isinstance(flow_claim, FlowClaim):
            flow_claim = FlowClaim(Flow(), Limits({}, {}))
        flow_claim.close(self.store, self.job_id, float(seconds), self._clock())
        raise RateLimited(float(seconds))

    def dependency_results(self) -> dict[str, Any]:
        """The results of this workflow job's dependencies, by their names in
        the workflow (``jobdeck.jobs.workflows``): what each handler returned. Empty
        for a job outside a workflow."""
        return self.store.dependency_results(self.job_id)

    @property
    def batch_id(self) -> int | None:
        """The batch this job belongs to, if any (``deck.open_batch(ctx.batch_id).add(...)``)."""
        return self.store.get(self.job_id).batch_id

    def check_cancelled(self) -> None:
        """Raise ``Cancelled`` if the job was cancelled while this attempt
        ran: the attempt stops here, the job ends cancelled, never retried."""
        if self.cancelled.is_set():
            raise Cancelled(self.job_id)

    def snooze(self, seconds: float, reason: str | None = None) -> NoReturn:
        """Stop this attempt and run the job again ``seconds`` from now,
        without counting a retry or a failure (raises ``Snooze``; returning
        ``Snooze(seconds)`` from the handler does the same)."""
        raise Snooze(seconds, reason)

    EFFECT_WAIT = 30.0
    """Seconds ``effect`` waits for another job's running attempt that holds
    the same key to finish it, before failing this attempt (retried later)."""

    def effect(self, key: str, fn: Callable[..., Any], *, replay_safe: bool = False) -> Any:
        """Perform the side effect ``fn`` at most once per ``key`` across every
        attempt, worker and job, and never lose it::

            charge = ctx.effect(f"charge:{order_id}", lambda: gateway.charge(order_id, cents))

        Returns what ``fn`` returned, as stored (a JSON round trip; a value
        JSON cannot hold comes back as its ``repr``), whether ``fn`` ran now
        or an earlier attempt ran it: the handler reads the same value on
        every delivery.

        The key is recorded ``started`` (by this attempt) before ``fn`` runs
        and ``done`` with the result after. Then:

        - ``fn`` raises ``EffectNotPerformed``: the effect certainly did not
          happen; the key is withdrawn and the attempt fails as usual, so
          the retry performs it.
        - ``fn`` raises anything else, or the process dies: the outcome is
          unknown, the key stays ``started``, and the next attempt that
          reaches it sends the job to ``dead`` ("effect K was started by
          attempt N and its outcome is unknown") for a person to check the
          far side and mark it done or not performed on the job's page.
        - ``replay_safe=True`` says the downstream deduplicates by the key
          itself (a payment gateway's idempotency key): ``fn(key)`` gets the
          key to forward, and an unknown outcome is simply performed again.

        A ``started`` key held by another job's attempt that is still
        running is in flight, not lost: this attempt waits up to
        ``EFFECT_WAIT`` seconds for its outcome.
        """
        key = effects.checked_key(key)
        if self.trace is not None:
            with self.trace.effect(key):
                return self._effect(key, fn, replay_safe)
        return self._effect(key, fn, replay_safe)

    def _effect(self, key: str, fn: Callable[..., Any], replay_safe: bool) -> Any:
        call: Callable[[], Any] = (lambda: fn(key)) if replay_safe else fn
        waited_until = time.monotonic() + self.EFFECT_WAIT
        pause = 0.02
        while True:
            begun = self._begin_effect(key, replay_safe)
            if self._decided(key, begun, waited_until) is Decision.SKIP:
                return begun.record.result
            if begun.decision is Decision.PERFORM:
                return self._perform(key, call)
            time.sleep(pause)  # a handler thread waiting on another process's commit; nothing to wake it
            pause = min(0.5, pause * 2)

    def _begin_effect(self, key: str, replay_safe: bool) -> effects.Begun:
        return effects.begin(
            self.store.ledger, key, self.job_id, self.attempt, self.worker_id, self._clock(), replay_safe=replay_safe
        )

    def _decided(self, key: str, begun: effects.Begun, waited_until: float) -> Decision:
        """``begun``'s decision, logged; raises for an unknown outcome, and
        for a wait past ``waited_until``."""
        seen = begun.record
        if begun.decision is Decision.PERFORM:
            if begun.replayed is not None:
                was = begun.replayed.attempt
                self.log.warning("effect %s: outcome of attempt %s unknown; replaying (replay-safe)", key, was)
        elif begun.decision is Decision.SKIP:
            self.log.info("effect %s already done (job %s attempt %s); skipping", key, seen.job_id, seen.attempt)
        elif begun.decision is Decision.UNKNOWN:
            raise begun.unknown_error(self.job_id)
        elif time.monotonic() >= waited_until:
            raise EffectInProgress(f"effect {key} is being performed by attempt {seen.attempt} of job {seen.job_id}")
        return begun.decision

    def _perform(self, key: str, call: Callable[[], Any]) -> Any:
        ledger = self.store.ledger
        try:
            value = call()
        except EffectNotPerformed:
            ledger.withdraw(key, self.job_id, self.attempt, self._clock())
            raise
        if inspect.isawaitable(value):  # never awaited: not performed, and its repr is no result
            getattr(value, "close", lambda: None)()
            ledger.withdraw(key, self.job_id, self.attempt, self._clock())
            raise TypeError(f"effect {key}: fn returned an awaitable; use `await ctx.aeffect(key, fn)`")
        stored = storable(value)
        self._record_done(key, stored)
        return json.loads(stored)

    FINISH_TRIES = 6
    """Writes of ``done`` tried before giving up (about 3 s of backoff)."""

    def _record_done(self, key: str, stored: str) -> None:
        """The effect happened: record it through a brief database outage,
        since an unrecorded ``done`` reads as unknown and sends the job to
        a person. A write that still fails leaves it ``started``: unknown,
        never repeated."""
        # Imported here, as the store is below: a process executor's child
        # subclasses this context, never writes, and starts without SQLAlchemy.
        from sqlalchemy.exc import OperationalError

        delay = 0.1
        for tries_left in range(self.FINISH_TRIES - 1, -1, -1):
            try:
                self.store.ledger.finish(key, self.job_id, self.attempt, stored, self._clock())
                return
            except OperationalError:
                if tries_left == 0:
                    raise
                self.log.warning("effect %s happened; recording it failed, retrying in %.1f s", key, delay)
                time.sleep(delay)  # backoff between tries of one write; nothing to wake for
                delay *= 2

    def once(self, key: str) -> bool:
        """Deprecated: use ``effect``. Records ``key`` as done at once and
        returns True the first time only, so a crash before the caller's
        side effect loses it (the very gap ``effect`` closes)."""
        warnings.warn("JobContext.once is deprecated; use ctx.effect(key, fn)", DeprecationWarning, stacklevel=2)
        start = self.store.ledger.start(key, self.job_id, self.attempt, self.worker_id, self._clock())
        if start.mine:
            self.store.ledger.finish(key, self.job_id, self.attempt, storable(None), self._clock())
        return start.mine

    def artifact(self, name: str, data_or_path: ArtifactData, content_type: str | None = None) -> ArtifactInfo:
        """Keep a file for people to download from the job's page and the
        API (``GET /api/jobs/<id>/artifacts/<name>``)::

            ctx.artifact("sales.csv", csv_text)
            ctx.artifact("chart.png", Path("/tmp/chart.png"))

        ``data_or_path`` is bytes, text (stored as UTF-8) or a path whose
        file is read now. ``content_type`` defaults from the name's
        extension. The bytes go in the database, with the job: storing the
        same name again (a later attempt) replaces them, and retention
        deletes them with the job. A bad name, or more than ``[artifacts]
        max_bytes``, raises ``InvalidArtifact`` (``ArtifactTooLarge``): the
        attempt fails with its message and is not retried."""
        from jobdeck.store.artifacts import ArtifactInfo, save_artifact  # as in _record_done

        name = check_name(name)
        limit = self.store.artifact_max_bytes
        data, text = read_data(name, data_or_path, limit)
        kind = default_content_type(name, text) if content_type is None else check_content_type(content_type)
        now = self._clock()
        if not save_artifact(self.store, self.job_id, self.attempt, name, kind, data, now):
            self.log.warning("artifact %r of job %s: a later attempt stored it already; kept", name, self.job_id)
        return ArtifactInfo(self.job_id, self.attempt, name, kind, len(data), now)

    def progress(self, fraction: float | None, message: str | None = None) -> None:
        """Report progress (0..1) with an optional message; shown live."""
        if fraction is not None:
            fraction = max(0.0, min(1.0, float(fraction)))
        self.store.set_progress(self.job_id, self.attempt, self.worker_id, fraction, message, self._clock())
