"""A thousand idle connections do not take the server down.

waitress's defaults (100 connections, idle ones closed after 120 s,
``select()``) let about 100 idle sockets make ``jobdeck serve`` unreachable.
This opens 1,000 idle TCP connections to a real ``jobdeck serve`` (on
each ``http_server``) started
with the open-file limit most machines default to (soft 1024), and asks
``/api/health`` on a new connection: it must answer in under a second.
"""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS, ConfigError, load

from tests.adversarial.cli_process import JobdeckProcess, write_config

IDLE = 1000


def _soft_limit_1024() -> None:
    """In the server's process before exec: the common default soft limit,
    too low for 1,000 connections unless the server raises it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


@pytest.mark.alone  # a latency bound
@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_health_answers_within_a_second_while_a_thousand_connections_sit_idle(tmp_path: Path, http_server: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 100:  # this test process holds the other end of every connection
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 200), hard))
    if hard < IDLE + 200:
        pytest.skip(f"the hard open-file limit ({hard}) cannot hold {IDLE} connections")
    server = JobdeckProcess(
        tmp_path,
        write_config(tmp_path, workers=0, http_threads=4, http_server=http_server),
        preexec_fn=_soft_limit_1024,
    )
    idle: list[socket.socket] = []
    try:
        server.wait_serving()
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        # Each idle socket is known to the server once it was accepted: a
        # request on the last one is answered only after all before it.
        idle[-1].sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
        idle[-1].settimeout(10)
        assert idle[-1].recv(100).startswith(b"HTTP/1.1 200"), "the 1,000th connection was not served"

        timings = []
        for _ in range(5):
            began = time.monotonic()
            assert server.health(timeout=10).get("ok") is True
            timings.append(time.monotonic() - began)
        server.alive()
        worst = max(timings)
        print(f"\n{http_server}: /api/health with {IDLE} idle connections open: worst of 5 {worst * 1000:.0f} ms")
        assert worst < 1.0, f"/api/health took {worst:.2f} s with {IDLE} idle connections"
    finally:
        for s in idle:
            s.close()
        server.kill()


def test_http_limits_are_settings_validated_at_start() -> None:
    config = load(path=None, env={"JOBDECK_HTTP_CONNECTION_LIMIT": "5000", "JOBDECK_HTTP_CHANNEL_TIMEOUT": "12.5"})
    assert (config.http_connection_limit, config.http_channel_timeout) == (5000, 12.5)
    for key, bad in (("http_connection_limit", 0), ("http_channel_timeout", -1.0), ("http_threads", 0)):
        with pytest.raises(ConfigError, match=key):
            load(path=None, env={}, overrides={key: bad})
