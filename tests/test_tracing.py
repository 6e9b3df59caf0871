"""Traces (``jobdeck.tracing``, docs/tracing.md): each attempt's span on a real
worker pool, read back with the SDK's in-memory exporter; the config that
turns tracing on; the provider set up from the ``OTEL_*`` variables; and,
with tracing off, no OpenTelemetry module imported at all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.config import ConfigError, load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry, Snooze
from jobdeck.runtime import pool_for
from jobdeck.tracing import tracer_for
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]
_HOST: dict[str, Any] = {}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The host application's provider (this test process's), exporting to
    memory: Jobdeck must use it as it is. A provider is set once per process."""
    if not _HOST:
        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _HOST.update(provider=provider, exporter=exporter)
    assert trace.get_tracer_provider() is _HOST["provider"], "another provider was set in this test process"
    exporter: InMemorySpanExporter = _HOST["exporter"]
    exporter.clear()
    yield exporter
    exporter.clear()


def _handlers(registry: Registry) -> None:
    calls: dict[str, int] = {}

    @registry.handler("t.flaky", backoff_base=0.05, backoff_cap=0.1)
    def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
        calls[payload["k"]] = calls.get(payload["k"], 0) + 1
        if calls[payload["k"]] <= payload["fails"]:
            raise ValueError(f"try {calls[payload['k']]} of {payload['k']}")
        return "done"

    @registry.handler("t.later")
    def later(payload: dict[str, Any], ctx: JobContext) -> Any:
        if calls.setdefault("later", 0) == 0:
            calls["later"] = 1
            return Snooze(0.05)
        return None

    @registry.handler("t.cancel")
    def cancel(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.cancelled.wait(20)  # as a cancel-aware handler waits: woken by the cancel itself
        ctx.check_cancelled()


def _run(deck: Jobdeck, job_ids: list[int], finished: set[State]) -> None:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        wait_for(
            lambda: all(deck.store.get(i).status in finished for i in job_ids), timeout=20, message="jobs finished"
        )
    finally:
        pool.stop(grace=5)


def _runs(exporter: InMemorySpanExporter, job_id: int) -> list[ReadableSpan]:
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("job.run ") and (s.attributes or {}).get("jobdeck.job.id") == job_id
    ]
    return sorted(found, key=lambda s: (s.attributes or {})["jobdeck.job.attempt"])


pytestmark = pytest.mark.backends


def test_each_attempt_is_a_span_with_the_messaging_attributes_and_its_outcome(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    _handlers(registry)
    deck = make_deck(tracing={"enabled": True})
    ok, _ = deck.enqueue("t.flaky", {"k": "ok", "fails": 0}, queue="mail", priority=7)
    retried, _ = deck.enqueue("t.flaky", {"k": "retried", "fails": 2}, max_retries=3)
    dead, _ = deck.enqueue("t.flaky", {"k": "dead", "fails": 9}, max_retries=1)
    snoozed, _ = deck.enqueue("t.later")
    ids = [ok.id, retried.id, dead.id, snoozed.id]
    _run(deck, ids, {State.COMPLETED, State.DEAD})

    (run,) = _runs(spans, ok.id)
    assert run.name == "job.run t.flaky" and run.kind is SpanKind.CONSUMER
    attributes = dict(run.attributes or {})
    assert float(attributes.pop("jobdeck.job.queued_seconds")) >= 0  # type: ignore[arg-type]
    assert attributes == {
        "messaging.system": "jobdeck",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(ok.id),
        "jobdeck.job.id": ok.id,
        "jobdeck.job.type": "t.flaky",
        "jobdeck.job.queue": "mail",
        "jobdeck.job.attempt": 1,
        "jobdeck.job.priority": 7,
        "jobdeck.job.outcome": "completed",
    }
    assert run.status.status_code is StatusCode.UNSET and not run.events

    # Retries: one span per attempt, failed twice with the exception recorded, then completed.
    runs = _runs(spans, retried.id)
    assert [s.attributes["jobdeck.job.outcome"] for s in runs] == ["failed", "failed", "completed"]  # type: ignore[index]
    for number, failed in enumerate(runs[:2], start=1):
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.status.description == f"ValueError: try {number} of retried"
        exception, retry = failed.events
        assert exception.name == "exception" and exception.attributes is not None
        assert exception.attributes["exception.type"] == "ValueError"
        assert exception.attributes["exception.message"] == f"try {number} of retried"
        assert "raise ValueError" in str(exception.attributes["exception.stacktrace"])
        assert (retry.name, dict(retry.attributes or {})) == ("job.retry", {"jobdeck.job.retry_count": number})

    runs = _runs(spans, dead.id)
    assert [s.attributes["jobdeck.job.outcome"] for s in runs] == ["failed", "dead"]  # type: ignore[index]
    assert [e.name for e in runs[1].events] == ["exception", "job.dead"]

    runs = _runs(spans, snoozed.id)
    assert [s.attributes["jobdeck.job.outcome"] for s in runs] == ["snoozed", "completed"]  # type: ignore[index]
    assert [(e.name, dict(e.attributes or {})) for e in runs[0].events] == [
        ("job.snoozed", {"jobdeck.snooze.seconds": 0.05})
    ]
    assert runs[0].status.status_code is StatusCode.UNSET

    assert trace.get_tracer_provider() is _HOST["provider"], "the host's provider was replaced"


def test_a_cancelled_attempt_is_not_an_error(spans: InMemorySpanExporter, make_deck: Any, registry: Registry) -> None:
    _handlers(registry)
    deck = make_deck(tracing={"enabled": True})
    job, _ = deck.enqueue("t.cancel")
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.RUNNING, message="the handler runs")
        deck.cancel(job.id, "test")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, message="cancelled")
    finally:
        pool.stop(grace=5)
    (run,) = _runs(spans, job.id)
    assert run.attributes["jobdeck.job.outcome"] == "cancelled"  # type: ignore[index]
    assert run.status.status_code is StatusCode.UNSET
    assert [e.name for e in run.events] == ["exception"]  # the Cancelled raised, for the record


def test_a_handler_runs_inside_its_attempt_span(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    seen: list[Any] = []

    @registry.handler("t.inside")
    def inside(payload: dict[str, Any], ctx: JobContext) -> None:
        with trace.get_tracer("handler").start_as_current_span("charge card"):
            seen.append(trace.get_current_span().get_span_context())

    deck = make_deck(tracing={"enabled": True})
    job, _ = deck.enqueue("t.inside")
    _run(deck, [job.id], {State.COMPLETED})
    (run,) = _runs(spans, job.id)
    (child,) = [s for s in spans.get_finished_spans() if s.name == "charge card"]
    assert child.parent is not None and child.parent.span_id == run.context.span_id
    assert child.context.trace_id == run.context.trace_id == seen[0].trace_id


def test_an_async_handler_runs_inside_its_attempt_span_and_its_effects_are_children(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    """On the pool's event loop each task has its own context: the attempt's
    span is current in its handler, and an ``aeffect`` is its child."""
    seen: list[Any] = []

    async def charge() -> dict[str, int]:
        await asyncio.sleep(0)
        return {"charged": 500}

    @registry.handler("t.async_inside")
    async def inside(payload: dict[str, Any], ctx: Any) -> Any:
        await asyncio.sleep(0.01)
        seen.append(trace.get_current_span().get_span_context())
        return await ctx.aeffect(f"charge:{payload['n']}", charge)

    deck = make_deck(tracing={"enabled": True})
    jobs = [deck.enqueue("t.async_inside", {"n": n})[0] for n in range(3)]
    _run(deck, [j.id for j in jobs], {State.COMPLETED})
    runs = {job.id: _runs(spans, job.id)[0] for job in jobs}
    assert {s.span_id for s in seen} == {run.context.span_id for run in runs.values()}, "each its own span"
    effects = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("effect ")}
    for n, job in enumerate(jobs):
        effect = effects[f"effect charge:{n}"]
        assert effect.parent is not None and effect.parent.span_id == runs[job.id].context.span_id


def test_nothing_is_exported_with_tracing_off(spans: InMemorySpanExporter, make_deck: Any, registry: Registry) -> None:
    _handlers(registry)
    deck = make_deck()
    assert tracer_for(deck.config) is None
    job, _ = deck.enqueue("t.flaky", {"k": "off", "fails": 1}, max_retries=1)
    _run(deck, [job.id], {State.COMPLETED})
    assert spans.get_finished_spans() == ()


# -- processes of their own: nothing imported when off, the OTEL_* set-up when on ----------------------

_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from jobdeck.core.config import load
    from jobdeck.deck import Jobdeck
    from jobdeck.jobs.handlers import Registry
    from jobdeck.runtime import pool_for

    registry = Registry()
    registry.handler("t.ok")(lambda payload, ctx: {"ok": True})
    registry.handler("t.bad")(lambda payload, ctx: 1 / 0)
    deck = Jobdeck(load(path=None, env=None, overrides={"database_url": sys.argv[1], "instance_path": sys.argv[2],
                                                          "workers": 0, "poll_interval": 0.05}), registry)
    deck.init_db()
    ids = [deck.enqueue("t.ok", {"n": 1})[0].id, deck.enqueue("t.bad", max_retries=0)[0].id]
    ids += deck.enqueue_many([{"type": "t.ok", "payload": {"n": n}} for n in range(3)])
    ids += [e.job.id for e in deck.enqueue_each([{"type": "t.ok"}, {"type": "t.ok", "priority": 2}])]
    pool = pool_for(deck, 2)
    pool.start()
    deadline = time.monotonic() + 20
    while not all(deck.store.get(i).status.value in ("completed", "dead") for i in ids):
        assert time.monotonic() < deadline, "the jobs did not finish"
        time.sleep(0.02)  # a poll with a deadline, as tests.conftest.wait_for, which this process cannot import
    pool.stop(grace=5)
    loaded = sorted(m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry."))
    print(json.dumps({"jobs": len(ids), "otel_modules": loaded}))
    """
)


def _script(tmp_path: Path, db_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "run_jobs.py"
    script.write_text(_SCRIPT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "JOBDECK_"))}
    return subprocess.run(
        [sys.executable, str(script), db_url, str(tmp_path / "instance")],
        env={**clean, **env}, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def test_tracing_off_imports_no_opentelemetry_module(tmp_path: Path, db_url: str) -> None:
    done = _script(tmp_path, db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"jobs": 7, "otel_modules": []}


def test_tracing_on_sets_the_provider_up_from_the_otel_variables(tmp_path: Path, db_url: str) -> None:
    done = _script(
        tmp_path, db_url, JOBDECK_TRACING="1", OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="billing-jobs"
    )
    assert done.returncode == 0, done.stderr
    # The batch processor exports at exit, after the script's report.
    report, exported = done.stdout.split("\n", 1)
    assert json.loads(report)["otel_modules"], "tracing on, yet OpenTelemetry was never imported"
    spans = [json.loads(chunk) for chunk in _json_objects(exported)]
    names = sorted(s["name"] for s in spans)
    assert names == ["job.run t.bad"] + ["job.run t.ok"] * 6
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"billing-jobs"}
    (bad,) = [s for s in spans if s["name"] == "job.run t.bad"]
    assert bad["status"]["status_code"] == "ERROR" and bad["attributes"]["jobdeck.job.outcome"] == "dead"
    assert bad["events"][0]["attributes"]["exception.type"] == "ZeroDivisionError"


def _json_objects(text: str) -> Iterator[str]:
    """The console exporter's spans: pretty-printed JSON objects, one after another."""
    decoder = json.JSONDecoder()
    at = 0
    while (start := text.find("{", at)) != -1:
        _, end = decoder.raw_decode(text, start)
        yield text[start:end]
        at = end


# -- the config --------------------------------------------------------------------------------


def test_tracing_is_off_unless_the_table_or_the_variable_turns_it_on(tmp_path: Path) -> None:
    base = {"instance_path": str(tmp_path)}
    assert load(path=None, env={}, overrides=base).extra.get("tracing") is None
    assert load(path=None, env={"JOBDECK_TRACING": "1"}, overrides=base).extra["tracing"] == {"enabled": True}
    toml = tmp_path / "jobdeck.toml"
    toml.write_text("[tracing]\nenabled = true\n")
    assert load(path=toml, env={}, overrides=base).extra["tracing"] == {"enabled": True}
    assert load(path=toml, env={"JOBDECK_TRACING": "off"}, overrides=base).extra["tracing"] == {"enabled": False}


@pytest.mark.parametrize(
    ("env", "table", "error"),
    [
        ({}, {"enabled": "yes"}, "tracing.enabled: expected true or false, got 'yes'"),
        ({}, {"endpoint": "http://x"}, "tracing.endpoint: unknown key (only enabled, trace_url)"),
        ({}, "on", "tracing: expected a table ([tracing])"),
        ({"JOBDECK_TRACING": "maybe"}, None, "JOBDECK_TRACING: expected true or false, got 'maybe'"),
    ],
)
def test_a_bad_tracing_setting_is_refused_with_its_name(
    tmp_path: Path, env: dict[str, str], table: Any, error: str
) -> None:
    overrides: dict[str, Any] = {"instance_path": str(tmp_path)}
    if table is not None:
        overrides["tracing"] = table
    with pytest.raises(ConfigError, match="^" + error.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load(path=None, env=env, overrides=overrides)


# -- the context travels with the job ----------------------------------------------------------

_HEADER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_TRACE_ID, _SPAN_ID = int("0af7651916cd43dd8448eb211c80319c", 16), int("b7ad6b7169203331", 16)


def test_a_job_enqueued_in_a_span_runs_every_attempt_as_its_child(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    _handlers(registry)
    deck = make_deck(tracing={"enabled": True})
    with trace.get_tracer("host app").start_as_current_span("POST /signup") as request_span:
        job, _ = deck.enqueue("t.flaky", {"k": "signup", "fails": 2}, max_retries=2)
        many = deck.enqueue_many([{"type": "t.flaky", "payload": {"k": f"m{n}", "fails": 0}} for n in range(2)])
        each = [e.job.id for e in deck.enqueue_each([{"type": "t.flaky", "payload": {"k": "e", "fails": 0}}])]
    stored = deck.store.get(job.id).traceparent
    assert stored is not None and stored.startswith(
        f"00-{request_span.get_span_context().trace_id:032x}-{request_span.get_span_context().span_id:016x}-"
    )
    _run(deck, [job.id, *many, *each], {State.COMPLETED})
    runs = _runs(spans, job.id)
    assert [s.attributes["jobdeck.job.outcome"] for s in runs] == ["failed", "failed", "completed"]  # type: ignore[index]
    for job_id in (*many, *each):
        runs += _runs(spans, job_id)
    assert len(runs) == 6
    context = request_span.get_span_context()
    for run in runs:  # retries are sibling spans: each attempt a child of the enqueue's context
        assert run.context.trace_id == context.trace_id
        assert run.parent is not None and run.parent.span_id == context.span_id and run.parent.is_remote
        assert float(run.attributes["jobdeck.job.queued_seconds"]) >= 0  # type: ignore[arg-type,index]
    # The time in queue: a span beside each attempt's, from when it was due to its claim.
    waits = sorted(
        (
            s
            for s in spans.get_finished_spans()
            if (s.attributes or {}).get("jobdeck.job.id") == job.id and s.name == "job.wait t.flaky"
        ),
        key=lambda s: (s.attributes or {})["jobdeck.job.attempt"],
    )
    assert [(s.attributes or {})["jobdeck.job.attempt"] for s in waits] == [1, 2, 3]
    for wait in waits:
        assert wait.parent is not None and wait.parent.span_id == context.span_id
        assert wait.start_time is not None and wait.end_time is not None and wait.start_time <= wait.end_time


def test_an_http_enqueue_continues_the_traceparent_header(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    from jobdeck import create_app

    _handlers(registry)
    deck = make_deck(tracing={"enabled": True})
    client = create_app(deck=deck).test_client()
    one = client.post("/api/jobs", json={"type": "t.flaky", "payload": {"k": "http", "fails": 1}}, headers={
        "traceparent": _HEADER
    })  # fmt: skip
    bulk = client.post("/api/jobs/bulk", json={"jobs": [{"type": "t.flaky", "payload": {"k": "b", "fails": 0}}]},
                       headers={"traceparent": _HEADER})  # fmt: skip
    bad = client.post("/api/jobs", json={"type": "t.flaky", "payload": {"k": "bad", "fails": 0}}, headers={
        "traceparent": "00-not-a-trace-01"
    })  # fmt: skip
    plain = client.post("/api/jobs", json={"type": "t.flaky", "payload": {"k": "plain", "fails": 0}})
    assert [r.status_code for r in (one, bulk, bad, plain)] == [201] * 4
    ids = [one.get_json()["id"], bulk.get_json()["jobs"][0]["id"], bad.get_json()["id"], plain.get_json()["id"]]
    assert [deck.store.get(i).traceparent for i in ids] == [_HEADER, _HEADER, None, None]
    _run(deck, ids, {State.COMPLETED})
    followed = _runs(spans, ids[0]) + _runs(spans, ids[1])
    assert len(followed) == 3  # a retry and a completion, and the bulk's job
    for run in followed:
        assert (run.context.trace_id, run.parent and run.parent.span_id) == (_TRACE_ID, _SPAN_ID)
    for job_id in ids[2:]:  # an invalid header is ignored (W3C): a trace of its own
        (run,) = _runs(spans, job_id)
        assert run.parent is None and run.context.trace_id != _TRACE_ID


def test_with_tracing_off_no_context_is_stored(make_deck: Any, registry: Registry) -> None:
    from jobdeck import create_app

    deck = make_deck()
    client = create_app(deck=deck).test_client()
    answer = client.post("/api/jobs", json={"type": "demo.noop"}, headers={"traceparent": _HEADER})
    with trace.get_tracer("host app").start_as_current_span("a request"):
        job, _ = deck.enqueue("demo.noop")
    assert [deck.store.get(i).traceparent for i in (answer.get_json()["id"], job.id)] == [None, None]


def test_an_http_worker_claims_the_job_with_its_traceparent(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    from jobdeck import create_app

    deck = make_deck(tracing={"enabled": True}, external_types=["ext.resize"])
    client = create_app(deck=deck).test_client()
    traced = client.post("/api/jobs", json={"type": "ext.resize"}, headers={"traceparent": _HEADER}).get_json()
    plain = client.post("/api/jobs", json={"type": "ext.resize", "priority": -1}).get_json()
    assert (traced["traceparent"], plain["traceparent"]) == (_HEADER, None)
    claimed = client.post("/api/jobs/claim", json={"worker_id": "go-1", "types": ["ext.resize"], "limit": 2})
    assert claimed.status_code == 200
    assert [(j["id"], j["traceparent"]) for j in claimed.get_json()] == [(traced["id"], _HEADER), (plain["id"], None)]
    assert client.get(f"/api/jobs/{traced['id']}").get_json()["traceparent"] == _HEADER


# -- workflows, batches and schedules ----------------------------------------------------------


def test_a_workflow_and_a_batch_share_the_trace_that_enqueued_them(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    _handlers(registry)
    deck = make_deck(tracing={"enabled": True})
    with trace.get_tracer("host app").start_as_current_span("POST /orders") as request_span:
        flow = deck.workflow("order")
        flow.add("charge", "t.flaky", {"k": "charge", "fails": 0})
        flow.add("ship", "t.flaky", {"k": "ship", "fails": 0}, depends_on=["charge"])
        enqueued = flow.enqueue()
        batch = deck.batch(name="mailing")
        mail = batch.add("t.flaky", {"k": "mail", "fails": 0})
    job_ids = [*enqueued.jobs.values(), mail]
    _run(deck, job_ids, {State.COMPLETED})
    runs = [run for job_id in job_ids for run in _runs(spans, job_id)]
    assert len(runs) == 3
    context = request_span.get_span_context()
    for run in runs:
        assert run.context.trace_id == context.trace_id and run.parent and run.parent.span_id == context.span_id


def test_each_schedule_fire_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    from datetime import UTC, datetime

    from tests.conftest import Clock

    clock = Clock()
    entry = {"name": "tick", "cron": "* * * * *", "type": "demo.noop"}
    deck = make_deck(clock=clock, tracing={"enabled": True}, schedules=[entry])
    clock.now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert deck.schedules.enqueue_due_once(clock.now) == []  # first sight: starts from now
    fired = []
    with trace.get_tracer("host app").start_as_current_span("an unrelated span") as unrelated:
        for minute in (1, 2):
            clock.now = datetime(2026, 1, 1, 12, minute, 5, tzinfo=UTC)
            fired += deck.schedules.enqueue_due_once(clock.now)
    assert len(fired) == 2
    fires = sorted(
        (s for s in spans.get_finished_spans() if s.name == "schedule.fire tick"),
        key=lambda s: str((s.attributes or {})["jobdeck.schedule.fire_time"]),
    )
    assert [(s.attributes or {})["jobdeck.schedule.fire_time"] for s in fires] == [
        "2026-01-01T12:01:00+00:00",
        "2026-01-01T12:02:00+00:00",
    ]
    assert all(s.parent is None and s.kind is SpanKind.PRODUCER for s in fires)
    trace_ids = {s.context.trace_id for s in fires}
    assert len(trace_ids) == 2 and unrelated.get_span_context().trace_id not in trace_ids
    for job_id, fire in zip(sorted(fired), fires):
        stored = deck.store.get(job_id).traceparent
        assert stored is not None and stored.startswith(f"00-{fire.context.trace_id:032x}-{fire.context.span_id:016x}-")


def test_log_lines_are_events_and_effects_are_child_spans(
    spans: InMemorySpanExporter, make_deck: Any, registry: Registry
) -> None:
    @registry.handler("t.effects")
    def effects(payload: dict[str, Any], ctx: JobContext) -> Any:
        ctx.log("copied %d rows", 3)
        ctx.log.warning("disk almost full")
        charged = ctx.effect("charge:42", lambda: {"charged": 500})
        ctx.effect("mail:42", lambda: 1 / 0)
        return charged

    deck = make_deck(tracing={"enabled": True})
    job, _ = deck.enqueue("t.effects", max_retries=0)
    _run(deck, [job.id], {State.DEAD})
    (run,) = _runs(spans, job.id)
    logs = [dict(e.attributes or {}) for e in run.events if e.name == "job.log"]
    assert logs == [
        {"jobdeck.log.level": "info", "jobdeck.log.message": "copied 3 rows"},
        {"jobdeck.log.level": "warning", "jobdeck.log.message": "disk almost full"},
    ]
    found = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("effect ")}
    assert set(found) == {"effect charge:42", "effect mail:42"}
    for effect in found.values():
        assert effect.parent is not None and effect.parent.span_id == run.context.span_id
    assert found["effect charge:42"].status.status_code is StatusCode.UNSET
    assert found["effect mail:42"].status.status_code is StatusCode.ERROR
    assert [e.name for e in found["effect mail:42"].events] == ["exception"]


# -- the dashboard links out -------------------------------------------------------------------


def test_a_traced_jobs_attempts_link_to_the_trace(spans: InMemorySpanExporter, make_deck: Any) -> None:
    from jobdeck import create_app

    url = "https://tempo.example/trace/{trace_id}?from=jobdeck&x=<y>"
    deck = make_deck(tracing={"enabled": True, "trace_url": url})
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    client = app.test_client()
    traced = client.post("/api/jobs", json={"type": "demo.noop"}, headers={"traceparent": _HEADER}).get_json()
    plain = client.post("/api/jobs", json={"type": "demo.noop"}).get_json()
    _run(deck, [traced["id"], plain["id"]], {State.COMPLETED})
    page = client.get(f"/jobs/{traced['id']}").get_data(as_text=True)
    link = "https://tempo.example/trace/0af7651916cd43dd8448eb211c80319c?from=jobdeck&amp;x=&lt;y&gt;"
    assert f'href="{link}"' in page and "View trace" in page
    assert "View trace" not in client.get(f"/jobs/{plain['id']}").get_data(as_text=True)


@pytest.mark.parametrize(
    "url", ["tempo.example/trace/{trace_id}", "https://tempo.example/trace/", "javascript:{trace_id}", 7]
)
def test_a_trace_url_must_be_http_and_hold_the_trace_id(tmp_path: Path, url: Any) -> None:
    with pytest.raises(ConfigError, match=r"^tracing\.trace_url: expected an http\(s\) URL holding \{trace_id\}"):
        load(path=None, env={}, overrides={"instance_path": str(tmp_path), "tracing": {"trace_url": url}})


def test_an_http_workers_reports_join_its_trace(spans: InMemorySpanExporter, make_deck: Any) -> None:
    from jobdeck import create_app

    deck = make_deck(tracing={"enabled": True}, external_types=["ext.resize"])
    client = create_app(deck=deck).test_client()
    ids = [client.post("/api/jobs", json={"type": "ext.resize"}, headers={"traceparent": _HEADER}).get_json()["id"]]
    ids.append(client.post("/api/jobs", json={"type": "ext.resize", "max_retries": 0}).get_json()["id"])
    ids.append(client.post("/api/jobs", json={"type": "ext.resize"}).get_json()["id"])
    claimed = client.post("/api/jobs/claim", json={"worker_id": "go-1", "limit": 3}).get_json()
    assert [j["traceparent"] for j in claimed] == [_HEADER, None, None]
    # The worker's own attempt span (a child of the job's context) names itself on its reports.
    worker_span = "1111111111111111"
    own = f"00-0af7651916cd43dd8448eb211c80319c-{worker_span}-01"
    done = client.post(f"/api/jobs/{ids[0]}/complete", json={"worker_id": "go-1", "attempt": 1}, headers={
        "traceparent": own
    })  # fmt: skip
    other = "00-22222222222222222222222222222222-3333333333333333-01"
    failed = client.post(f"/api/jobs/{ids[1]}/fail", json={"worker_id": "go-1", "error": "boom"}, headers={
        "traceparent": other
    })  # fmt: skip
    untraced = client.post(f"/api/jobs/{ids[2]}/complete", json={"worker_id": "go-1"})
    late = client.post(f"/api/jobs/{ids[0]}/complete", json={"worker_id": "go-1"}, headers={"traceparent": own})
    assert [r.status_code for r in (done, failed, untraced, late)] == [200, 200, 200, 409]
    acks = [s for s in spans.get_finished_spans() if s.name.startswith("job.ack ")]
    assert [(s.name, (s.attributes or {})["jobdeck.job.id"]) for s in acks] == [
        ("job.ack complete", ids[0]), ("job.ack fail", ids[1]), ("job.ack complete", ids[0])
    ]  # fmt: skip
    assert (acks[0].context.trace_id, acks[0].parent and acks[0].parent.span_id) == (_TRACE_ID, int(worker_span, 16))
    assert acks[1].context.trace_id == int("2" * 32, 16)
    assert acks[0].status.status_code is StatusCode.UNSET
    assert acks[2].status.status_code is StatusCode.ERROR and acks[2].events[0].name == "exception"
