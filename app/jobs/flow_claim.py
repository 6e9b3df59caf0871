"""The flow limits at work: the claim's pick under every limit at once
(global concurrency of ``jobdeck.jobs.queues``, concurrency per key, rates, closed
limits), the handler's 429 (``close``), and each limit's current use for
the queues page and API (``describe``). The SQL is ``jobdeck.store.flow``'s."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from jobdeck.jobs.flow import NO_KEY, START_SLACK, Flow, FlowLimit, Limits, shown_key
from jobdeck.store import JobRecord, Store, flow_pipelined
from jobdeck.store import flow as store_flow


def _key(value: str | None) -> str:
    """A job's stored key as the limits count it: no key is the ``null`` bucket."""
    return "null" if value is None else value


class FlowClaim:
    """The claim policy's flow part; one per process (it keeps where each key walk stopped)."""

    def __init__(self, flow: Flow, limits: Limits, monotonic: Any = time.monotonic) -> None:
        self.flow = flow
        self.limits = limits
        self._monotonic = monotonic
        self._cursors: dict[str, str] = dict.fromkeys(flow.keyed_columns, "")
        self._pruned: dict[str, float] = {}
        self._guess = flow_pipelined.Guess()
        """What the last claim's reads answered (PostgreSQL's head read and key walks go with them)."""
        self._lock = threading.Lock()

    def _window_start(self, limit: FlowLimit, now: datetime) -> datetime:
        assert limit.rate is not None
        return now - timedelta(seconds=limit.rate.window + START_SLACK)

    def _to_prune(self, now: datetime) -> list[tuple[str, datetime]]:
        due: list[tuple[str, datetime]] = []
        mono = self._monotonic()
        with self._lock:
            for f in self.flow.rated:
                assert f.rate is not None
                if mono - self._pruned.get(f.ident, -1e18) >= max(1.0, f.rate.window / 2):
                    self._pruned[f.ident] = mono
                    due.append((f.ident, now - timedelta(seconds=2 * (f.rate.window + START_SLACK) + 1)))
        return due

    def claim(
        self,
        store: Store,
        worker_id: str,
        now: datetime,
        limit: int,
        types: Iterable[str] | None,
        queues: Iterable[str] | None,
        paused: frozenset[str],
    ) -> list[JobRecord]:
        rated = [(f.ident, self._window_start(f, now), bool(f.rate_key)) for f in self.flow.rated]
        with self._lock:
            walks = dict(self._cursors)
        prune = self._to_prune(now)
        skip = sorted(paused)

        def pick(reads: store_flow.FlowReads, rows: list[Any]) -> list[tuple[int, list[tuple[str, str]]]]:
            return self.pick(reads, rows, limit)

        request = store_flow.FlowRequest(
            worker_id, now, limit, None if types is None else list(types), None if queues is None else list(queues),
            skip, walks, rated, prune, self.blocked, pick,
        )  # fmt: skip
        if store.sqlite:
            claimed, cursors = store_flow.claim_flow(store, request)
        else:
            claimed, cursors, self._guess = flow_pipelined.claim_flow(store, request, self._guess)
        with self._lock:
            self._cursors.update(cursors)
        return claimed

    def blocked(self, reads: store_flow.FlowReads) -> tuple[list[str], list[str]]:
        """The types and the queues no job of can start now: a global
        concurrency reached, an unkeyed rate used up, or closed as a whole."""
        by_type: Counter[str] = Counter()
        by_queue: Counter[str] = Counter()
        for r in reads.running:
            by_type[r.type] += r.count
            by_queue[r.queue] += r.count
        types = {t for t, n in self.limits.types.items() if by_type[t] >= n}
        queues = {q for q, n in self.limits.queues.items() if by_queue[q] >= n}
        for f in self.flow.limits:
            full = f.rate is not None and not f.rate_key and reads.starts.get((f.ident, NO_KEY), 0) >= f.rate.count
            if full or (f.ident, NO_KEY) in reads.closed:
                (types if f.scope == "type" else queues).add(f.name)
        for name, key in reads.closed:
            scope, _, target = name.partition(":")
            if key == NO_KEY:
                (types if scope == "type" else queues).add(target)
        return sorted(types), sorted(queues)

    def pick(self, reads: store_flow.FlowReads, rows: list[Any], limit: int) -> list[tuple[int, list[tuple[str, str]]]]:
        """The candidates (claim order) that every limit allows, up to ``limit``,
        each with the starts its claim records. Pure: tests call it directly."""
        by_type: Counter[str] = Counter()
        by_queue: Counter[str] = Counter()
        by_key: Counter[tuple[str, str]] = Counter()
        for r in reads.running:
            by_type[r.type] += r.count
            by_queue[r.queue] += r.count
            for f in self.flow.for_job(r.type, r.queue):
                if f.concurrency_key:
                    by_key[(f.ident, _key(r.key))] += r.count
        starts: Counter[tuple[str, str]] = Counter(reads.starts)
        chosen: list[tuple[int, list[tuple[str, str]]]] = []
        held, closed, for_job = self.held, reads.closed, self.flow.for_job
        for row in rows:
            if held(row.type, row.queue, row.rate_key, row.concurrency_key, by_type, by_queue, by_key, starts, closed):
                continue
            recorded = []
            for f in for_job(row.type, row.queue):
                if f.concurrency_key:
                    by_key[(f.ident, _key(row.concurrency_key))] += 1
                if f.rate is not None:
                    recorded.append((f.ident, _key(row.rate_key) if f.rate_key else NO_KEY))
            for s in recorded:
                starts[s] += 1
            by_type[row.type] += 1
            by_queue[row.queue] += 1
            chosen.append((row.id, recorded))
            if len(chosen) >= limit:
                break
        return chosen

    def held(
        self, job_type: str, queue: str, rate_key: str | None, concurrency_key: str | None,
        by_type: Counter[str], by_queue: Counter[str], by_key: Counter[tuple[str, str]],
        starts: Counter[tuple[str, str]], closed: dict[tuple[str, str], datetime],
    ) -> dict[str, Any] | None:  # fmt: skip
        """The first limit that holds this job back (a waiting reason's
        fields), or None."""
        types, queues = self.limits.types, self.limits.queues
        if types and job_type in types and by_type[job_type] >= types[job_type]:
            return _reason("concurrency", "type", job_type, types[job_type])
        if queues and queue in queues and by_queue[queue] >= queues[queue]:
            return _reason("concurrency", "queue", queue, queues[queue])
        for scope, name in (("type", job_type), ("queue", queue)) if closed else ():
            ident = f"{scope}:{name}"
            for k in (NO_KEY, _key(rate_key)):
                if (ident, k) in closed:
                    return {**_reason("closed", scope, name, None, k or None), "until": closed[(ident, k)]}
        for f in self.flow.for_job(job_type, queue):
            if f.concurrency_key and f.concurrency is not None:
                k = _key(concurrency_key)
                if by_key[(f.ident, k)] >= f.concurrency:
                    return _reason("concurrency_key", f.scope, f.name, f.concurrency, k)
            if f.rate is not None:
                k = _key(rate_key) if f.rate_key else NO_KEY
                if starts[(f.ident, k)] >= f.rate.count:
                    return {**_reason("rate", f.scope, f.name, f.rate.count, k or None), "rate": f.rate.text}
        return None

    # -- the handler's 429 ------------------------------------------------------

    def close(self, store: Store, job_id: int, seconds: float, now: datetime) -> datetime:
        """Close the job's rate limits (for its key, if keyed) until now +
        ``seconds``, for every process; its type when no rate limit applies."""
        found = store_flow.job_flow_keys(store, job_id)
        until = now + timedelta(seconds=seconds)
        if found is None:
            return until
        job_type, queue, rate_key, _ = found
        closing = [
            (f.ident, _key(rate_key) if f.rate_key else NO_KEY)
            for f in self.flow.for_job(job_type, queue)
            if f.rate is not None
        ] or [(f"type:{job_type}", NO_KEY)]
        store_flow.close_limits(store, closing, until, job_id)
        return until

    # -- reads ------------------------------------------------------------------

    def describe(self, store: Store, now: datetime) -> list[dict[str, Any]]:
        """Each flow limit with its current use (the API's ``limits``)."""
        windows = [(f.ident, self._window_start(f, now), f.rate.count) for f in self.flow.rated if f.rate]
        use = store_flow.window_use(store, windows, now) if windows else {}
        closed = store_flow.closed_limits(store, now)
        running = store_flow.running_by_key(store)
        out: list[dict[str, Any]] = []
        for f in self.flow.limits:
            shut = [u for (n, _), u in closed.items() if n == f.ident]
            entry: dict[str, Any] = {"scope": f.scope, "name": f.name}
            if f.rate is not None:
                u = use.get(f.ident, {})
                used = u.get("starts", {}).get(NO_KEY, 0)
                at = u.get("keys_at_limit", 0)
                text = (
                    f"{at} {'key at its' if at == 1 else 'keys at their'} limit of {f.rate.count} per {f.rate.window_text}"
                    if f.rate_key
                    else f"{used} of {f.rate.count} in the last {f.rate.window_text}"
                )
                entry["rate"] = {
                    "limit": f.rate.count, "window_seconds": f.rate.window, "key": f.rate_key,
                    "used": None if f.rate_key else used, "keys_at_limit": at if f.rate_key else None, "text": text,
                }  # fmt: skip
            if f.concurrency_key is not None and f.concurrency is not None:
                per: Counter[str] = Counter()
                for r in running:
                    if f.applies(r.type, r.queue):
                        per[_key(r.key)] += r.count
                full = sum(1 for n in per.values() if n >= f.concurrency)
                entry["concurrency_per_key"] = {
                    "limit": f.concurrency, "key": f.concurrency_key, "keys_running": len(per), "keys_at_limit": full,
                    "text": f"{full} {'key at its' if full == 1 else 'keys at their'} limit of {f.concurrency} running",
                }  # fmt: skip
            until = _z(max(shut)) if shut else None
            entry["closed_until"] = until
            entry["closed_text"] = f"closed until {until} (rate limited by handler)" if until else None
            out.append(entry)
        return out


def waiting_check(flow_claim: FlowClaim, store: Store, now: datetime) -> Any:
    """``held(job)`` for the waiting reasons: the flow reads made once (running
    jobs by key, closed limits, the windows' starts by key), then pure."""
    by_type: Counter[str] = Counter()
    by_queue: Counter[str] = Counter()
    by_key: Counter[tuple[str, str]] = Counter()
    for r in store_flow.running_by_key(store):
        by_type[r.type] += r.count
        by_queue[r.queue] += r.count
        for f in flow_claim.flow.for_job(r.type, r.queue):
            if f.concurrency_key:
                by_key[(f.ident, _key(r.key))] += r.count
    windows = [(f.ident, flow_claim._window_start(f, now), f.rate.count) for f in flow_claim.flow.rated if f.rate]
    starts: Counter[tuple[str, str]] = Counter()
    for name, use in (store_flow.window_use(store, windows, now) if windows else {}).items():
        for k, n in use["starts"].items():
            starts[(name, k)] = n
    closed = store_flow.closed_limits(store, now)

    def held(job: JobRecord) -> dict[str, Any] | None:
        return flow_claim.held(
            job.type, job.queue, job.rate_key, job.concurrency_key, by_type, by_queue, by_key, starts, closed
        )

    return held


def _z(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _reason(kind: str, scope: str, name: str, limit: int | None, key: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "scope": scope, "name": name, "limit": limit, "key": key}


def reason_message(held: dict[str, Any]) -> str:
    """A person's sentence for ``FlowClaim.held``'s answer."""
    key = f" for key {shown_key(held['key'])}" if held.get("key") else ""
    what = f"{held['scope']} {held['name']}"
    if held["kind"] == "rate":
        return f"rate limit of {what}: {held['rate']} reached{key}"
    if held["kind"] == "concurrency_key":
        return f"concurrency limit of {what}: {held['limit']} running{key}"
    if held["kind"] == "closed":
        return f"rate limit of {what} closed{key} until {_z(held['until'])} (rate limited by handler)"
    return f"concurrency limit of {what}: {held['limit']} running"
