"""Tracing, black-box: ``jobdeck serve`` with ``JOBDECK_TRACING=1`` exports its
spans over OTLP/HTTP, configured by the ``OTEL_*`` variables alone, to a
receiver this test runs; the protobuf export is decoded with
``opentelemetry-proto`` (docs/tracing.md)."""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import wait_for
from tests.test_cli import _up, free_port, spawn

pytestmark = pytest.mark.slow  # other processes: left out of the quick tier

HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: keeps every span posted to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def found(self) -> list[tuple[dict[str, Any], Any]]:
        with self.lock:
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            export = ExportTraceServiceRequest.FromString(body)
            with got.lock:
                got.paths.append(self.path)
                for resource_spans in export.resource_spans:
                    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        got.spans += [(resource, span) for span in scope_spans.spans]
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


def test_serve_exports_the_attempt_spans_over_otlp(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    got, endpoint = receiver
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = spawn(
        tmp_path, "serve", "--demo", "--server", "waitress", "--bind", f"127.0.0.1:{port}",
        JOBDECK_TRACING="1", JOBDECK_SHUTDOWN_GRACE="0.5", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_SERVICE_NAME="shop-jobs", OTEL_BSP_SCHEDULE_DELAY="100",
    )  # fmt: skip
    try:
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=30, message="server up")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        ok = _post(f"{base}/api/jobs", {"type": "demo.noop"}, {"traceparent": HEADER})
        bad = _post(f"{base}/api/jobs", {"type": "demo.fail", "max_retries": 0}, {"traceparent": HEADER})

        def runs() -> dict[int, Any]:
            found = {}
            for _, span in got.found():
                job_id = _attributes(span).get("jobdeck.job.id")
                if job_id in (ok["id"], bad["id"]) and span.name.startswith("job.run "):
                    found[job_id] = span
            return found

        wait_for(lambda: len(runs()) == 2, timeout=30, message="both attempts exported")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except Exception:
            proc.kill()
            proc.communicate()
    assert set(got.paths) == {"/v1/traces"}
    spans = runs()
    for job_id, outcome in ((ok["id"], "completed"), (bad["id"], "dead")):
        span = spans[job_id]
        assert span.name in ("job.run demo.noop", "job.run demo.fail")
        assert span.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert span.parent_span_id.hex() == "00f067aa0ba902b7"
        assert _attributes(span)["jobdeck.job.outcome"] == outcome
        assert _attributes(span)["messaging.system"] == "jobdeck"
    assert [e.name for e in spans[bad["id"]].events] == ["exception", "job.dead"]
    assert {resource["service.name"] for resource, _ in got.found()} == {"shop-jobs"}
