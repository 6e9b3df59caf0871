"""``GET /metrics``: Jobdeck's figures in the Prometheus exposition format.

A custom ``prometheus_client`` collector reads the figures at scrape time
from what the dashboard already keeps (``jobdeck.store.metrics`` says which
reads, none of them a pass over the jobs table):

- ``jobdeck_jobs{state,queue}`` (gauge): waiting and running jobs per queue
  (``pending``, ``scheduled``, ``failed``, ``running``); the finished states
  (``completed``, ``dead``, ``discarded``, ``cancelled``), which only grow
  until retention, per state from the overview's snapshot, with
  ``queue="*"``. ``sum by (state)`` gives the overview's cards.
- ``jobdeck_job_runs_total{type,outcome}`` (counter): attempts ``completed``
  and ``failed`` (failed, timed out, stalled) and jobs gone ``dead``.
- ``jobdeck_job_duration_seconds{type}`` (histogram): attempts' run times.
- ``jobdeck_queue_latency_seconds{queue}``, ``jobdeck_queue_paused{queue}``,
  ``jobdeck_queue_workers_live{queue}``, ``jobdeck_workers_live``,
  ``jobdeck_schedule_last_success_timestamp_seconds{schedule}`` and
  ``jobdeck_stats_rolled_up_timestamp_seconds``.
- ``jobdeck_api_requests_total{token,code}`` (counter): API requests this
  process answered, by token name (``jobdeck.web.api_requests``: names from
  the config only, so the label's values are bounded).

Counters are monotonic across scrapes and processes: they are the all-time
sums in ``stats_totals``, which the maintenance roll-up adds each closed
minute to in the same transaction as to ``stats_minutely`` (the minute's
watermark moves by compare-and-set, so no minute is added twice), and which
retention never prunes. Every process answers the same numbers from the
same rows; they trail real time by the roll-up's settle time (a minute or
two, see ``jobdeck_stats_rolled_up_timestamp_seconds``). The histogram's
buckets are the roll-up's own edges (one per doubling from 1 ms), and its
``_sum`` is estimated from each bucket's middle (within about 19%).

Access is the API's (``jobdeck.web.guard.authenticate``): the bearer token, a
dashboard session, or, in an open deployment, a client on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, current_app
from jobdeck.core.clock import offset_of
from jobdeck.core.states import State
from jobdeck.store import durations
from jobdeck.store.metrics import (
    ACTIVE_STATES,
    SCHEDULED,
    active_by_queue,
    last_successes,
    live_workers,
    paused_queues,
    queue_latencies,
    rolled_up_until,
    schedule_names,
    type_totals,
)
from jobdeck.web import api_requests
from jobdeck.web.guard import authenticate
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

bp = Blueprint("metrics", __name__)

PER_QUEUE_STATES = (State.PENDING.value, SCHEDULED, State.FAILED.value, State.RUNNING.value)
FINISHED_STATES = tuple(s.value for s in State if s.value not in ACTIVE_STATES)
ALL_QUEUES = "*"
"""The ``queue`` label of the finished states' counts (all queues)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format, which every Prometheus reads (prometheus_client
0.26 labels the same bytes ``version=1.0.0``, which Prometheus 2 does not know)."""
HISTOGRAM_EDGES = tuple(range(0, durations.BUCKETS - 1, 2))
"""Indexes into ``durations.EDGES`` used as ``le`` bounds: 1 ms, 2 ms, 4 ms, ... about 2.3 h."""


def label(value: str) -> str:
    """A label value safe for every scraper: control characters other than
    the newline (which the format escapes) become U+FFFD, and text that is
    not valid Unicode is replaced."""
    cleaned = "".join("\ufffd" if (ord(c) < 32 and c != "\n") or ord(c) == 127 else c for c in value)
    return cleaned.encode("utf-8", "replace").decode("utf-8")


class JobdeckCollector:
    """Reads the figures once per scrape (``collect``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        deck = self.app.extensions["jobdeck"]
        store = deck.store
        now = deck.clock()
        snapshot = self.app.extensions["jobdeck_snapshots"].get(now)

        active = active_by_queue(store, now)
        paused = paused_queues(store)
        queues = sorted(set(active) | paused | {"default"})
        jobs_g = GaugeMetricFamily("jobdeck_jobs", "Jobs per state and queue.", labels=["state", "queue"])
        for queue in queues:
            for state in PER_QUEUE_STATES:
                jobs_g.add_metric([state, label(queue)], active.get(queue, {}).get(state, 0))
        for state in FINISHED_STATES:
            jobs_g.add_metric([state, ALL_QUEUES], snapshot.counts.get(state, 0))
        yield jobs_g

        paused_g = GaugeMetricFamily("jobdeck_queue_paused", "1 while an operator paused the queue.", labels=["queue"])
        latency_g = GaugeMetricFamily(
            "jobdeck_queue_latency_seconds",
            "Seconds the next job a worker would claim from the queue has been due (paused queues left out).",
            labels=["queue"],
        )
        latencies = queue_latencies(store, now, [q for q in queues if q not in paused])
        for queue in queues:
            paused_g.add_metric([label(queue)], 1 if queue in paused else 0)
            if queue in latencies:
                latency_g.add_metric([label(queue)], latencies[queue])
        yield paused_g
        yield latency_g

        pools = live_workers(store, now, deck.config.stall_timeout)
        yield GaugeMetricFamily("jobdeck_workers_live", "Worker pools heart-beating now.", value=len(pools))
        serving = GaugeMetricFamily(
            "jobdeck_queue_workers_live", "Live worker pools that claim from the queue.", labels=["queue"]
        )
        for queue in queues:
            serving.add_metric([label(queue)], sum(1 for p in pools if p.serves(queue)))
        yield serving
        yield from self._clocks(deck, pools)
        yield from self._executors(pools)

        yield from self._runs(store)
        yield from self._schedules(deck, store)
        yield self._requests()

    def _requests(self) -> Metric:
        requests = CounterMetricFamily(
            "jobdeck_api_requests",
            "API requests this process answered, by the token that made them (a name from [api_tokens], or "
            "api_token, session, invalid, anonymous) and the HTTP status.",
            labels=["token", "code"],
        )
        for (token, code), n in sorted(api_requests.counts_of(self.app).items()):
            requests.add_metric([token, code], n)
        return requests

    def _clocks(self, deck: Any, pools: list[Any]) -> Iterator[Metric]:
        """PostgreSQL: how far each host's clock is off the database's (``jobdeck.core.clock``)."""
        offset = offset_of(deck.clock)
        if offset is not None:
            yield GaugeMetricFamily(
                "jobdeck_clock_offset_seconds",
                "Seconds the database's clock is ahead of this process's host clock (negative: behind).",
                value=offset,
            )
        per_pool = GaugeMetricFamily(
            "jobdeck_worker_clock_offset_seconds",
            "Seconds the database's clock is ahead of each live worker pool's host clock, as the pool last measured.",
            labels=["worker"],
        )
        for p in pools:
            if p.clock_offset is not None:
                per_pool.add_metric([label(p.id)], p.clock_offset)
        yield per_pool

    def _executors(self, pools: list[Any]) -> Iterator[Metric]:
        """Each live pool's executors as its monitor last wrote them (``workers.executors``)."""
        busy = GaugeMetricFamily(
            "jobdeck_executor_busy", "Busy slots of each live worker pool's executors.", labels=["worker", "executor"]
        )
        capacity = GaugeMetricFamily(
            "jobdeck_executor_capacity", "Slots of each live worker pool's executors.", labels=["worker", "executor"]
        )
        restarts = CounterMetricFamily(
            "jobdeck_process_child_restarts",
            "Child processes of each live pool's process executor replaced, by cause "
            "(timeout, memory, crash, cancel, released, recycled); per pool, from its start.",
            labels=["worker", "cause"],
        )
        lag = GaugeMetricFamily(
            "jobdeck_async_loop_lag_seconds",
            "Seconds each live pool's event loop of async handlers is late for its tick (0 while it keeps up).",
            labels=["worker"],
        )
        for p in pools:
            seconds = ((p.executors or {}).get("async") or {}).get("lag")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool):
                lag.add_metric([label(p.id)], seconds)
            for name, held in sorted((p.executors or {}).items()):
                busy.add_metric([label(p.id), name], held.get("busy", 0))
                capacity.add_metric([label(p.id), name], held.get("capacity", 0))
            for cause, n in sorted(((p.executors or {}).get("process") or {}).get("restarts", {}).items()):
                restarts.add_metric([label(p.id), label(cause)], n)
        yield busy
        yield capacity
        yield restarts
        yield lag

    def _runs(self, store: Any) -> Iterator[Metric]:
        totals = type_totals(store)
        runs = CounterMetricFamily(
            "jobdeck_job_runs",
            "Attempts completed and failed, and jobs gone dead, per type.",
            labels=["type", "outcome"],
        )
        hist = HistogramMetricFamily("jobdeck_job_duration_seconds", "Run time of attempts, per type.", labels=["type"])
        for t in totals:
            name = label(t.type)
            runs.add_metric([name, State.COMPLETED.value], t.completed)
            runs.add_metric([name, State.FAILED.value], t.failed)
            runs.add_metric([name, State.DEAD.value], t.dead)
            cumulative = [sum(t.durations[: i + 1]) for i in range(durations.BUCKETS)]
            buckets = [(_le(durations.EDGES[i]), cumulative[i]) for i in HISTOGRAM_EDGES]
            buckets.append(("+Inf", cumulative[-1]))
            estimate = sum(n * durations.middle(i) for i, n in enumerate(t.durations))
            hist.add_metric([name], buckets, sum_value=estimate)
        yield runs
        yield hist

    def _schedules(self, deck: Any, store: Any) -> Iterator[Metric]:
        names = sorted(set(deck.schedules.schedules) | set(schedule_names(store)))
        last = last_successes(store, names)
        gauge = GaugeMetricFamily(
            "jobdeck_schedule_last_success_timestamp_seconds",
            "When the schedule's newest completed run finished (Unix time); absent before its first success.",
            labels=["schedule"],
        )
        for name, at in sorted(last.items()):
            gauge.add_metric([label(name)], at.timestamp())
        yield gauge
        mark = rolled_up_until(store)
        if mark is not None:
            yield GaugeMetricFamily(
                "jobdeck_stats_rolled_up_timestamp_seconds",
                "The counters and the histogram hold every attempt finished before this time (Unix time).",
                value=mark.timestamp(),
            )


def _le(edge: float) -> str:
    return f"{edge:.6g}"


def _registry() -> CollectorRegistry:
    registry: CollectorRegistry | None = current_app.extensions.get("jobdeck_metrics")
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobdeckCollector(current_app._get_current_object()))  # type: ignore[attr-defined]
        current_app.extensions["jobdeck_metrics"] = registry
    return registry


@bp.before_request
def _authenticate() -> Any:
    return authenticate()


@bp.get("/metrics")
def metrics() -> Any:
    """The exposition text (format 0.0.4)."""
    return Response(generate_latest(_registry()), content_type=CONTENT_TYPE)
