"""OpenTelemetry traces of job attempts, opt-in: ``[tracing] enabled = true``
or ``JOBDECK_TRACING=1``, with the ``otel`` extra installed
(``pip install 'jobdeck[otel]'``). Documented in ``docs/tracing.md``.

Off, nothing here imports OpenTelemetry: ``tracer_for`` answers None after
reading one config key, and the worker checks that None once per attempt.

On, each attempt runs in a span ``job.run <type>`` (kind CONSUMER) with the
messaging conventions' attributes and the job's own, its outcome, the
exception of a failure and an event for a retry, a snooze or dead. The
exporter, endpoint, service name, sampling and batching come from the
standard ``OTEL_*`` environment variables; a host application that set its
own ``TracerProvider`` first keeps it, used as it is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.config import Config, ConfigError, tracing_enabled
from jobdeck.core.errors import Cancelled

if TYPE_CHECKING:
    from jobdeck.jobs.context import JobContext
    from jobdeck.store import JobRecord, Outcome

INSTRUMENTATION = "jobdeck"
"""The tracer's (instrumentation scope's) name."""
DEFAULT_SERVICE_NAME = "jobdeck"
"""``service.name`` when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one."""
EXPORTERS = ("otlp", "console", "none")
"""What ``OTEL_TRACES_EXPORTER`` may list when Jobdeck sets the provider up."""

_setup_lock = threading.Lock()


def tracer_for(config: Config) -> AttemptTracer | None:
    """The attempts' tracer when tracing is on, else None (and nothing imported)."""
    if not tracing_enabled(config):
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        raise ConfigError(
            "tracing.enabled: OpenTelemetry is not installed; install the otel extra: pip install 'jobdeck[otel]'"
        ) from None
    ensure_provider()
    return AttemptTracer(trace.get_tracer(INSTRUMENTATION))


def ensure_provider() -> None:
    """Set up the SDK's ``TracerProvider`` from the ``OTEL_*`` variables,
    unless the host already set one (kept as it is) or ``OTEL_SDK_DISABLED``
    is true (the API's no-op provider stays: nothing is recorded)."""
    from opentelemetry import trace

    with _setup_lock:
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return  # the host's provider, or ours from an earlier deck in this process
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ConfigError(
                "tracing.enabled: opentelemetry-sdk is not installed (and the host set no TracerProvider); "
                "install the otel extra: pip install 'jobdeck[otel]'"
            ) from None
        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER(_ARG)
        for exporter in _exporters():
            provider.add_span_processor(BatchSpanProcessor(exporter))  # batching: OTEL_BSP_*
        trace.set_tracer_provider(provider)


def _exporters() -> list[Any]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``: OTLP
    over HTTP/protobuf, its endpoint, headers and timeout from the
    ``OTEL_EXPORTER_OTLP_*`` variables)."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {unknown[0]!r} is not one of {', '.join(EXPORTERS)}")
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    )
    found: list[Any] = []
    if "otlp" in names:
        if protocol.strip() != "http/protobuf":
            raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, got {protocol!r}")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        found.append(OTLPSpanExporter())
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        found.append(ConsoleSpanExporter())
    return found


class AttemptTracer:
    """Reads the trace context at enqueue (``Jobdeck.new_job``) and starts
    each attempt's span (``jobdeck.worker.executors``) as its child."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()

    def current_traceparent(self) -> str | None:
        """The W3C ``traceparent`` to store on a job enqueued now: the current
        span's (a request instrumented with OpenTelemetry, a handler's
        attempt, the caller's own span), else, inside an HTTP request, the
        request's ``traceparent`` header; None when neither is there. An
        invalid header is ignored, as the W3C recommendation has it."""
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        if trace.get_current_span().get_span_context().is_valid:
            self.propagator.inject(carrier)
            return carrier.get("traceparent")
        header = _request_traceparent()
        if header is None:
            return None
        self.propagator.inject(carrier, context=self.propagator.extract({"traceparent": header}))
        return carrier.get("traceparent")  # re-written from what parsed: nothing else is stored

    @contextmanager
    def acknowledgement(self, job_id: int, outcome: str) -> Iterator[None]:
        """An HTTP worker's complete, fail, snooze or release: a span ``job.ack <outcome>``
        in the worker's trace, the child of the current span or else of the
        request's ``traceparent`` header (the worker's attempt span); no span
        without either. A refused call (409) is an error with its exception."""
        from opentelemetry import trace

        parent = None
        if not trace.get_current_span().get_span_context().is_valid:
            header = _request_traceparent()
            parent = self.propagator.extract({"traceparent": header}) if header else None
            if parent is None or not trace.get_current_span(parent).get_span_context().is_valid:
                yield
                return
        with self.tracer.start_as_current_span(
            f"job.ack {outcome}",
            context=parent,
            attributes={"messaging.system": "jobdeck", "messaging.operation.type": "settle", "jobdeck.job.id": job_id},
        ):
            yield

    @contextmanager
    def fire(self, schedule: str, at: datetime) -> Iterator[None]:
        """A schedule's fire: a span ``schedule.fire <name>`` (PRODUCER) that
        starts a trace of its own, current while the fire's job (or
        workflow) is made, so its attempts are children of it."""
        from opentelemetry import trace
        from opentelemetry.context import Context

        with self.tracer.start_as_current_span(
            f"schedule.fire {schedule}",
            context=Context(),
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "jobdeck",
                "messaging.operation.type": "create",
                "jobdeck.schedule.name": schedule,
                "jobdeck.schedule.fire_time": at.isoformat(),
            },
        ):
            yield

    @contextmanager
    def attempt(self, job: JobRecord) -> Iterator[AttemptSpan]:
        """The attempt's span, current on the handler's thread while it runs
        (so what the handler enqueues or calls is traced beneath it)."""
        from opentelemetry import trace
        from opentelemetry.context import Context

        parent = self.propagator.extract({"traceparent": job.traceparent}) if job.traceparent else Context()
        waited = _queued_seconds(job)
        if waited is not None and job.traceparent:
            self._wait_span(job, parent)
        span = self.tracer.start_span(
            f"job.run {job.type}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "jobdeck",
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "jobdeck.job.id": job.id,
                "jobdeck.job.type": job.type,
                "jobdeck.job.queue": job.queue,
                "jobdeck.job.attempt": job.attempt,
                "jobdeck.job.priority": job.priority,
                **({"jobdeck.job.queued_seconds": waited} if waited is not None else {}),
            },
        )
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            yield AttemptSpan(span, self.tracer)

    def _wait_span(self, job: JobRecord, parent: Any) -> None:
        """``job.wait <type>``: the time in queue, from when the attempt was
        due to its claim (database times), beside the attempt's span."""
        assert job.claimed_at is not None
        wait = self.tracer.start_span(
            f"job.wait {job.type}",
            context=parent,
            start_time=_ns(job.available_at),
            attributes={"messaging.system": "jobdeck", "jobdeck.job.id": job.id, "jobdeck.job.attempt": job.attempt},
        )
        wait.end(end_time=_ns(job.claimed_at))


def _queued_seconds(job: JobRecord) -> float | None:
    """Seconds from when the attempt was due to its claim; None if not known."""
    if job.claimed_at is None or job.available_at is None:
        return None
    return max(0.0, (job.claimed_at - job.available_at).total_seconds())


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


class AttemptSpan:
    """One attempt's span, told how the attempt ended."""

    def __init__(self, span: Any, tracer: Any) -> None:
        self.span = span
        self.tracer = tracer
        self.cancelled = False

    def instrument(self, ctx: JobContext) -> None:
        """``ctx.log`` lines become events of the span, and each ``ctx.effect`` a child span."""
        ctx.log.span = self.span
        ctx.trace = self

    @contextmanager
    def effect(self, key: str) -> Iterator[None]:
        """``ctx.effect(key, ...)``: a span ``effect <key>`` beneath the attempt's,
        with the exception recorded if the effect raised."""
        with self.tracer.start_as_current_span(f"effect {key}", attributes={"jobdeck.effect.key": key}):
            yield

    def failed(self, exc: BaseException) -> None:
        """The handler raised: the exception is recorded on the span."""
        self.cancelled = isinstance(exc, Cancelled)
        self.span.record_exception(exc)

    def settle(self, job: JobRecord, outcome: Outcome, *, late: bool, set_aside: bool) -> None:
        """The outcome as the worker reports it: ``jobdeck.job.outcome`` and
        the span's status, and an event when the job is retried, snoozed or dead."""
        from opentelemetry.trace import Status, StatusCode

        if late:
            name = "timed_out"  # refused: the monitor failed it (or released it) while the handler ran on
        elif set_aside:
            name = "released"  # its lease was lost: given back, not failed
        elif outcome.snooze is not None:
            name = "snoozed"
            self.span.add_event("job.snoozed", {"jobdeck.snooze.seconds": outcome.snooze})
        elif outcome.error is None:
            name = "completed"
        elif self.cancelled:
            name = "cancelled"
        elif outcome.retryable and job.retry_count < job.max_retries:
            name = "failed"
            self.span.add_event("job.retry", {"jobdeck.job.retry_count": job.retry_count + 1})
        else:
            name = "dead"
            self.span.add_event("job.dead")
        self.span.set_attribute("jobdeck.job.outcome", name)
        if outcome.error is not None and name != "cancelled":
            self.span.set_status(Status(StatusCode.ERROR, outcome.error.split("\n", 1)[0][:500]))


def _request_traceparent() -> str | None:
    """The ``traceparent`` header of the HTTP request being answered, if any."""
    from flask import has_request_context, request

    if not has_request_context():
        return None
    return request.headers.get("traceparent")


def trace_link(url_template: str, traceparent: str | None) -> str | None:
    """The dashboard's "View trace" link of a job stored with a trace context
    (``[tracing] trace_url``, ``{trace_id}`` replaced), else None. The id is
    the 32 hex digits of the stored ``traceparent``, nothing else."""
    if not url_template or not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or any(c not in "0123456789abcdef" for c in parts[1]):
        return None
    return url_template.replace("{trace_id}", parts[1])
