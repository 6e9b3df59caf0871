"""Queue controls: pause/resume a queue, and concurrency limits per queue and
per job type, both enforced at claim time.

Config::

    [queues.reports]
    concurrency = 1              # at most one reports job running, deployment-wide

    [types."demo.charge-card"]
    concurrency = 2

A paused queue is not claimed from; its running jobs finish. The paused set
lives in the database (``queue_state``) and each process re-reads it at most
every ``poll_interval`` seconds, so a pause reaches other processes within
about a second and costs the claim nothing in between.

Limits count running jobs in the database, so they hold across every worker
of every process. Correctness comes from doing the count and the claim in one
write transaction that no other limited claim can interleave with: on SQLite
every write transaction is ``BEGIN IMMEDIATE`` (one writer at a time); on
PostgreSQL the limited claim takes a transaction-scoped advisory lock
(``pg_advisory_xact_lock``) before counting. With no limits configured the
claim is the store's ordinary single statement, minus the paused queues.

Rate limits and concurrency per key (``jobdeck.jobs.flow``) are parsed beside these;
with any configured, ``jobdeck.jobs.flow_claim`` claims instead, under every limit at
once, in the same kind of serialized transaction (``jobdeck.store.flow``). A
``concurrency`` with a ``concurrency_key`` is per key, not global.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from jobdeck import actions
from jobdeck.core.config import Config, ConfigError
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import State
from jobdeck.core.validation import MAX_QUEUE_CHARS, spellings
from jobdeck.jobs.flow import Flow, Limits
from jobdeck.jobs.flow_claim import FlowClaim
from jobdeck.store import JobRecord, Store, controls

_RUNNING = State.RUNNING.value


def parse_limits(config: Config) -> Limits:
    """Read ``[queues.NAME] concurrency`` and ``[types.NAME] concurrency``."""
    found: dict[str, dict[str, int]] = {"queues": {}, "types": {}}
    for table in ("queues", "types"):
        section = config.extra.get(table, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{table}: expected a table of {table[:-1]} names")
        for name, options in section.items():
            if not isinstance(options, dict):
                raise ConfigError(f"{table}.{name}: expected a table")
            if "concurrency" not in options:
                continue
            value = options["concurrency"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{table}.{name}.concurrency: must be an integer >= 1, got {value!r}")
            if "concurrency_key" not in options:  # with a key it is per key (jobdeck.jobs.flow)
                found[table][name] = value
    return Limits(found["queues"], found["types"])


class QueueControls:
    """The claim policy installed on the store, and pause/resume."""

    def __init__(
        self,
        store: Store,
        limits: Limits,
        refresh: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        flow: Flow | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.flow = flow if flow is not None else Flow()
        """Rate limits and concurrency per key (``jobdeck.jobs.flow``); with any, ``flow_claim`` claims."""
        self.flow_claim = FlowClaim(self.flow, limits)
        self._blocked = controls.Blocked()
        """What the last limited claim found (``controls.Blocked``): what each dialect's claim may skip."""
        self.refresh = refresh
        self._monotonic = monotonic
        self._paused: frozenset[str] = frozenset()
        self._read_at: float | None = None
        self._pauses = 0
        """Pauses and resumes this process made: a read begun before one is not cached."""
        self._lock = threading.Lock()

    def install(self) -> None:
        self.store.claim_policy = self

    # -- pause / resume ---------------------------------------------------------

    def paused(self) -> frozenset[str]:
        """The paused queues, re-read when the cached set is older than ``refresh``."""
        with self._lock:
            fresh = self._read_at is not None and self._monotonic() - self._read_at < self.refresh
            if fresh:
                return self._paused
            pauses = self._pauses
        names = controls.paused_queues(self.store)
        with self._lock:
            # A read that began before a pause or resume of this process
            # committed may not have seen it: cached, it would hide the
            # change for ``refresh`` seconds (a job enqueued to a queue just
            # paused was claimed, and its answer said it would run).
            if self._pauses == pauses:
                self._paused, self._read_at = names, self._monotonic()
        return names

    def set_paused(self, name: str, paused: bool, now: datetime, actor: str) -> dict[str, Any]:
        """Pause or resume the queue ``name`` NFC-normalized, where new jobs
        land (``jobdeck.core.validation.spellings``), and ``name`` as given too when a
        queue of that spelling exists (one enqueued to before names were
        normalized): the operator meant both, and no lookalike is made."""
        *given, normal = spellings(name)
        if len(normal) > MAX_QUEUE_CHARS:  # NFC lengthens some names past the column (``check_name``)
            raise InvalidField("name", f"a queue name is 1 to {MAX_QUEUE_CHARS} characters once NFC-normalized")
        known = {q["name"] for q in self.list_queues()} if given else set()
        for spelled in [normal, *(g for g in given if g in known)]:
            controls.set_paused(self.store, spelled, paused, now)
        with self._lock:
            self._read_at = None
            self._pauses += 1
        actions.record(actor, "queue.pause" if paused else "queue.resume", name, now, store=self.store)
        return self.describe(name if name in known else normal)

    # -- reads ------------------------------------------------------------------

    def list_queues(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every queue with jobs waiting or running, paused or limited; a queue
        with flow limits (``jobdeck.jobs.flow``) lists them with their use as of ``now``."""
        counts, paused = controls.queue_counts(self.store)
        flow_queues = {f.name for f in self.flow.limits if f.scope == "queue"}
        names = sorted(set(counts) | set(paused) | set(self.limits.queues) | flow_queues | {"default"})
        found = [self._describe(n, counts.get(n, {}), bool(paused.get(n))) for n in names]
        if self.flow:
            by_queue = {q["name"]: q for q in found}
            for entry in self.flow_limits(now):
                if entry["scope"] == "queue":
                    by_queue[entry["name"]].setdefault("limits", []).append(entry)
        return found

    def flow_limits(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Each rate or per-key limit with its current use (``jobdeck.jobs.flow_claim``)."""
        return self.flow_claim.describe(self.store, now or datetime.now(UTC))

    def describe(self, name: str) -> dict[str, Any]:
        for queue in self.list_queues():
            if queue["name"] == name:
                return queue
        return self._describe(name, {}, False)

    def _describe(self, name: str, counts: dict[str, int], paused: bool) -> dict[str, Any]:
        return {
            "name": name,
            "paused": paused,
            "waiting": counts.get(State.PENDING.value, 0) + counts.get(State.FAILED.value, 0),
            "running": counts.get(_RUNNING, 0),
            "concurrency": self.limits.queues.get(name),
        }

    # -- the claim ----------------------------------------------------------------

    def holding_back(self) -> bool:
        """Whether a concurrency limit may hold claims back now, so a job's
        end may make another claimable (the pool's acker then claims in the
        completions' transaction: ``jobdeck.worker.acks``). Always with a
        concurrency per key (``jobdeck.jobs.flow``); with a limit on a type or
        a queue, unless the last claim was quiet (``controls.Blocked``): it
        took no job of a limited type or queue and found none of them full.
        The demo's limit on ``demo.charge-card`` made a PostgreSQL drain of
        other jobs claim in the acker's transaction, one cycle at a time: the
        drain ran 25 to 30% slower than with the fetcher claiming beside it.
        The first claim of a limited job, or one that finds a limit full,
        turns it back on for the next cycle. It reads no database: the
        paused queues as the last claim read them (the acker asks before
        every cycle, outside the writes it retries through an outage)."""
        if any(lim.concurrency for lim in self.flow.limits):
            return True
        return bool(self.limits) and not self._blocked.quiet(self._paused)

    def __call__(
        self,
        store: Store,
        worker_id: str,
        now: datetime,
        *,
        limit: int = 1,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
    ) -> list[JobRecord]:
        paused = self.paused()
        if self.flow:
            return self.flow_claim.claim(store, worker_id, now, limit, types, queues, paused)
        if not self.limits:
            return store.claim(
                worker_id, now, limit=limit, types=types, queues=queues, exclude_queues=paused, controlled=False
            )
        return self._claim_limited(store, worker_id, now, limit, types, queues, paused)

    def _claim_limited(
        self,
        store: Store,
        worker_id: str,
        now: datetime,
        limit: int,
        types: Iterable[str] | None,
        queues: Iterable[str] | None,
        paused: frozenset[str],
    ) -> list[JobRecord]:
        """Count running jobs of each limited type and queue, then claim within
        what is left, in one serialized write transaction (see the module doc)."""
        lim = self.limits

        def decide(running_t: dict[str, int], running_q: dict[str, int]) -> tuple[list[str], list[str], controls.Pick]:
            left_t = {t: n - running_t.get(t, 0) for t, n in lim.types.items()}
            left_q = {q: n - running_q.get(q, 0) for q, n in lim.queues.items()}
            full_t = [t for t, n in left_t.items() if n <= 0]
            skip_q = list(paused) + [q for q, n in left_q.items() if n <= 0]

            def pick(rows: list[Any]) -> list[int]:
                chosen: list[int] = []
                for job_id, job_type, queue in rows:
                    if left_t.get(job_type, 1) <= 0 or left_q.get(queue, 1) <= 0:
                        continue
                    chosen.append(job_id)
                    if job_type in left_t:
                        left_t[job_type] -= 1
                    if queue in left_q:
                        left_q[queue] -= 1
                    if len(chosen) >= limit:
                        break
                return chosen

            return full_t, skip_q, pick

        return controls.claim_due(
            store, worker_id, now, limit=limit, types=types, queues=queues,
            limited_types=lim.types, limited_queues=lim.queues, decide=decide, blocked=self._blocked,
            paused=paused,
        )  # fmt: skip
