"""Tracing, black-box: ``jobdeck serve`` with ``JOBDECK_TRACING=1`` exports its
spans over OTLP/HTTP, configured by the ``OTEL_*`` variables alone, to a
receiver this test runs; the protobuf export is decoded with
``opentelemetry-proto`` (docs/tracing.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _serving(tmp_path: Path, endpoint: str, **env: str) -> Iterator[str]:
    """A real ``jobdeck serve --demo`` (waitress) with tracing on, exporting
    to ``endpoint`` as service ``shop-jobs``: its base URL while the block
    runs, then SIGTERM (its batch exporter flushes on the way out)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = spawn(
        tmp_path, "serve", "--demo", "--server", "waitress", "--bind", f"127.0.0.1:{port}",
        JOBDECK_TRACING="1", JOBDECK_SHUTDOWN_GRACE="0.5", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_SERVICE_NAME="shop-jobs", OTEL_BSP_SCHEDULE_DELAY="100", **env,
    )  # fmt: skip
    try:
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=30, message="server up")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except Exception:
            proc.kill()
            proc.communicate()


def test_serve_exports_the_attempt_spans_over_otlp(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    got, endpoint = receiver
    with _serving(tmp_path, endpoint) as base:
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


ORDER_HEADER = "00-8f5e0c3a7d1b4e26a9c4f1d2b3e4a5c6-5b1d2e3f4a5b6c7d-01"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "tracing.md"
BLOCK = re.compile(r"(<!-- rendered by tests/test_tracing_otlp\.py[^>]*-->\n```text\n)(.*?)(```)", re.S)
EVENT_DETAIL = ("exception.type", "exception.message", "jobdeck.log.message")
TIMES = re.compile(r"\s*\+?\d+(\.\d+)? ms")


def render(spans: list[Any], root: str, label: str) -> str:
    """The spans of one trace as a tree under the span ``root`` (the
    caller's, not exported by Jobdeck): name, the attempt and outcome,
    when it started after the first span and how long it took; events as
    leaves. What docs/tracing.md shows."""
    children: dict[str, list[Any]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id.hex(), []).append(span)
    start = min(s.start_time_unix_nano for s in spans)
    lines = [label]

    def walk(parent: str, indent: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda s: s.start_time_unix_nano)
        for i, span in enumerate(kids):
            last = i == len(kids) - 1
            attrs = _attributes(span)
            what = " ".join(
                f"{k.rsplit('.', 1)[-1]}={attrs[k]}"
                for k in ("jobdeck.job.attempt", "jobdeck.job.outcome")
                if k in attrs
            )
            at = (span.start_time_unix_nano - start) / 1e6
            took = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
            head = f"{indent}{'└─' if last else '├─'} {span.name}  {what}".rstrip()
            lines.append(f"{head:<62} +{at:.0f} ms {took:.0f} ms")
            inner = indent + ("   " if last else "│  ")
            events = [" ".join([e.name, *(str(_attributes(e)[k]) for k in EVENT_DETAIL if k in _attributes(e))])
                      for e in span.events]  # fmt: skip
            for j, name in enumerate(events):
                more = j < len(events) - 1 or bool(children.get(span.span_id.hex()))
                lines.append(f"{inner}{'├·' if more else '└·'} {name}")
            walk(span.span_id.hex(), inner)

    walk(root, "")
    return "\n".join(lines) + "\n"


def test_one_trace_end_to_end_is_the_one_the_tracing_page_shows(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    """A checkout request enqueues a charge whose first attempt charges the
    card (``ctx.effect``) and then fails; the retry finds the charge done
    and completes. Its trace, as exported over OTLP by a real ``jobdeck
    serve``, rendered as a tree, has the shape docs/tracing.md shows
    (times aside). ``JOBDECK_WRITE_DOCS=1`` writes the fresh rendering there."""
    got, endpoint = receiver
    trace_id, root = ORDER_HEADER.split("-")[1:3]
    payload = {"order_id": "42", "amount_cents": 1999, "fail_after_charge": True}

    def trace() -> list[Any]:
        return [span for _, span in got.found() if span.trace_id.hex() == trace_id]

    with _serving(tmp_path, endpoint, JOBDECK_BACKOFF_BASE="0.05", JOBDECK_BACKOFF_CAP="0.1") as base:
        job = _post(f"{base}/api/jobs", {"type": "demo.charge-card", "payload": payload}, {"traceparent": ORDER_HEADER})
        done = lambda: [s for s in trace() if s.name.startswith("job.run ") and  # noqa: E731
                        _attributes(s).get("jobdeck.job.outcome") == "completed"]  # fmt: skip
        wait_for(done, timeout=30, message="the retry's span exported")
    spans = trace()
    runs = sorted((s for s in spans if s.name.startswith("job.run ")), key=lambda s: s.start_time_unix_nano)
    assert [_attributes(s)["jobdeck.job.outcome"] for s in runs] == ["failed", "completed"]
    assert {_attributes(s)["jobdeck.job.id"] for s in runs} == {job["id"]}
    tree = render(spans, root, f"POST /checkout  (your application's span {root})")
    if os.environ.get("JOBDECK_WRITE_DOCS"):
        DOCS.write_text(BLOCK.sub(lambda m: m.group(1) + tree + m.group(3), DOCS.read_text()))
    shown = BLOCK.search(DOCS.read_text())
    assert shown is not None, "docs/tracing.md has no rendered trace block"
    assert TIMES.sub("", shown.group(2)) == TIMES.sub("", tree), tree
