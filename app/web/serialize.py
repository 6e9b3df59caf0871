"""JSON shapes of jobs, attempts, artifacts, workflows and batches, shared
by the API and the dashboard, with every time written by ``iso``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from jobdeck.core.states import priority_label
from jobdeck.jobs.waiting import Situation, WaitingReasons, for_deck, situation_loader
from jobdeck.store import AttemptRecord, JobRecord
from jobdeck.store.artifacts import ArtifactInfo
from jobdeck.store.graph import BatchRecord, WorkflowGraph, WorkflowRecord
from jobdeck.store.records import Holders


def iso(value: datetime | None) -> str | None:
    """A time as the API writes every one: ISO 8601 in UTC with a ``Z``."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.isoformat().replace("+00:00", "Z")


def artifact_json(info: ArtifactInfo) -> dict[str, Any]:
    """An artifact as the API lists it: its stored fields, the time in ``iso``."""
    return {**info.to_dict(), "created_at": iso(info.created_at)}


def job_json(job: JobRecord, now: datetime, attempts: list[AttemptRecord] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": job.id,
        "type": job.type,
        "queue": job.queue,
        "payload": job.payload,
        "priority": job.priority,
        "priority_label": priority_label(job.priority),
        "status": job.status.value,
        "scheduled": job.is_scheduled(now),
        "attempt": job.attempt,
        "retry_count": job.retry_count,
        "max_retries": job.max_retries,
        "idempotency_key": job.idempotency_key,
        "unique_key": job.unique_key,
        "available_at": iso(job.available_at),
        "claimed_at": iso(job.claimed_at),
        "heartbeat_at": iso(job.heartbeat_at),
        "worker_id": job.worker_id,
        "error": job.error,
        "result": job.result,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "finished_at": iso(job.finished_at),
        "workflow_id": job.workflow_id,
        "batch_id": job.batch_id,
        "step": job.step,
        "traceparent": job.traceparent,
    }
    if job.omitted:  # a list bounded by bytes left these out (``jobdeck.store.listing``)
        data.update(dict.fromkeys(job.omitted), omitted=list(job.omitted))
    reasons = request_waiting()
    if reasons is not None:
        data["waiting_reason"] = reasons.of(job)
    if attempts is not None:
        data["attempts"] = [attempt_json(a) for a in attempts]
    return data


def attempt_json(a: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt": a.attempt,
        "worker_id": a.worker_id,
        "started_at": iso(a.started_at),
        "finished_at": iso(a.finished_at),
        "duration_seconds": a.duration,
        "outcome": a.outcome,
        "error": a.error,
        "traceback": a.traceback,
        "payload": a.payload,
        "snooze_seconds": a.snooze_seconds,
        "executor": a.executor,
    }


def workflow_json(workflow: WorkflowRecord) -> dict[str, Any]:
    """A workflow as the API lists it: its state and progress read from its
    jobs' counts by state (``WorkflowRecord.state``)."""
    return {
        "id": workflow.id,
        "name": workflow.name,
        "key": workflow.key,
        "on_dependency_failure": workflow.on_dependency_failure,
        "state": workflow.state,
        "counts": workflow.counts,
        "total": workflow.total,
        "done": workflow.done,
        "created_at": iso(workflow.created_at),
    }


def workflow_graph_json(graph: WorkflowGraph, now: datetime) -> dict[str, Any]:
    """A workflow with its jobs (id order) and its edges, one per dependency.
    Each job is a node of the graph, without its payload, result or error:
    a workflow of a thousand jobs stays a small answer, and each job's own
    JSON is one ``GET /api/jobs/<id>`` away."""
    return {
        **workflow_json(graph.workflow),
        "jobs": [workflow_job_json(j, now) for j in graph.jobs],
        "edges": [{"job": job_id, "depends_on": dep} for job_id, dep in graph.edges],
    }


def workflow_job_json(job: JobRecord, now: datetime) -> dict[str, Any]:
    return {
        "id": job.id,
        "step": job.step,
        "type": job.type,
        "queue": job.queue,
        "priority": job.priority,
        "status": job.status.value,
        "scheduled": job.is_scheduled(now),
        "attempt": job.attempt,
        "max_retries": job.max_retries,
        "deps_left": job.deps_left,
        "on_dependency_failure": job.on_dependency_failure,
        "available_at": iso(job.available_at),
        "claimed_at": iso(job.claimed_at),
        "finished_at": iso(job.finished_at),
    }


def batch_json(batch: BatchRecord) -> dict[str, Any]:
    """A batch: ``open`` while jobs can be added, ``running`` once closed,
    ``fired`` once its callbacks were enqueued (``outcome`` says which)."""
    return {
        "id": batch.id,
        "name": batch.name,
        "state": batch.state,
        "callbacks": batch.callbacks,
        "counts": batch.counts,
        "total": batch.total,
        "done": batch.done,
        "created_at": iso(batch.created_at),
        "closed_at": iso(batch.closed_at),
        "fired_at": iso(batch.fired_at),
        "outcome": batch.outcome,
    }


class SharedRead:
    """One "why is it waiting?" read (``jobdeck.jobs.waiting.situation_loader``) for
    every enqueue answer that asks while it is in flight (a single flight).

    Where the enqueue did not read them with its commit (PostgreSQL; a
    keyed or unique job: ``Enqueued.holders``), each answer to ``POST
    /api/jobs`` reads the running jobs and the live pools once, in a read
    transaction of its own: under 16 concurrent
    enqueues that read was a quarter of the server's busy time (each SQLite
    call gives up and takes back the GIL). The reads do not depend on the
    job being answered, so concurrent answers share one; an answer alone
    reads alone, as before. A shared read is at most one read's duration
    older than the answer's own would have been, and takes the answer's
    own ``now`` (a job due now is never called scheduled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flight: Future[Situation] | None = None

    def reasons(self, load: Callable[[], Situation], now: datetime) -> WaitingReasons:
        return WaitingReasons(lambda: self._situation(load, now))

    def _situation(self, load: Callable[[], Situation], now: datetime) -> Situation:
        with self._lock:
            flight = self._flight
            leading = flight is None
            if flight is None:
                flight = self._flight = Future()
        if leading:
            try:
                flight.set_result(load())
            except BaseException as exc:  # the followers raise it too
                flight.set_exception(exc)
            finally:
                with self._lock:
                    self._flight = None
        return replace(flight.result(), now=now)


def enqueue_waiting(now: datetime, holders: Holders | None = None) -> None:
    """This enqueue answer's waiting reasons (``request_waiting``): from
    ``holders``, what the enqueue read right after its commit
    (``Enqueued.holders``), or else from a read shared with the concurrent
    enqueue answers (``SharedRead``)."""
    from flask import current_app, g

    deck = current_app.extensions["jobdeck"]
    if holders is not None:
        g.jobdeck_waiting = WaitingReasons(situation_loader(deck, now, holders))
        return
    shared: SharedRead = current_app.extensions.setdefault("jobdeck.enqueue_waiting", SharedRead())
    g.jobdeck_waiting = shared.reasons(situation_loader(deck, now), now)


def request_waiting() -> WaitingReasons | None:
    """This request's "why is it waiting?" reasons (``jobdeck.jobs.waiting``), made
    once per request so a list of jobs reads the store once; None outside a
    request (the CLI's ``show``), where job JSON has no ``waiting_reason``.
    Flask is not imported for it: a process that never loaded Flask (the
    CLI's ``enqueue``, ``show`` and ``jobs``) is in no request, and loading it
    cost each of those commands about a tenth of a second."""
    flask = sys.modules.get("flask")
    if flask is None or not flask.has_request_context():
        return None
    from flask import current_app, g

    reasons: WaitingReasons | None = g.get("jobdeck_waiting")
    if reasons is None:
        deck = current_app.extensions["jobdeck"]
        reasons = g.jobdeck_waiting = for_deck(deck, deck.clock())
    return reasons
