"""The waitress server ``jobdeck serve`` runs, with limits that hold up.

waitress's defaults (``connection_limit`` 100, ``channel_timeout`` 120 s,
a select-based loop) let about 100 idle connections make the server unreachable:
once the limit is reached it stops accepting, and idle connections are only
closed two minutes later. Jobdeck's defaults hold 2,000 open connections
(``http_connection_limit``) and close idle ones after 30 s
(``http_channel_timeout``); an idle connection holds no thread. The loop
uses ``poll``, since the select call cannot watch a descriptor above 1023.
Each connection is a file descriptor, so the process's soft limit is raised
to fit, up to the hard limit.

waitress reads a request whole before a thread runs it, so slow clients
hold no thread; a request still arriving ``http_body_timeout`` seconds
after its first byte is answered 408 and its connection closed
(``_Channel``), and a request carrying both ``Content-Length`` and
``Transfer-Encoding`` is refused with 400 (``_Parser``): waitress would
read the chunked body and answer the request smuggled after it.

The loop runs on its own thread; the main thread waits for signals
(``jobdeck.shutdown``) and stops it through waitress's trigger, so the stop
runs inside the loop, between two polls, never as an exception.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import threading
import time
from typing import Any

from jobdeck.core.config import Config
from jobdeck.web.body_limits import body_cap, larger_bodies, too_large
from waitress import create_server, wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser, ParsingError
from waitress.utilities import RequestEntityTooLarge

log = logging.getLogger("jobdeck.http")

CHUNK_FRAMING = 64 * 1024
"""What a chunked body's framing may add to twice its cap (waitress counts
the framing; the cap is on the bytes): more framing than that is a 413."""
FD_RESERVE = 128
"""Descriptors kept for everything but HTTP connections: database
connections, log files, the wake-up sockets, the listening socket."""


def raise_fd_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to ``needed`` if it is lower, at most to
    the hard limit; returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("raised the open-file limit from %d to %d", soft, target)
        soft = target
    return needed if soft == resource.RLIM_INFINITY else int(soft)


def connection_limit(config: Config) -> int:
    """``http_connection_limit``, lowered (with a warning) to what the
    process's file-descriptor limit allows after raising it."""
    wanted = config.http_connection_limit
    allowed = raise_fd_limit(wanted + FD_RESERVE) - FD_RESERVE
    if allowed < wanted:
        log.warning(
            "http_connection_limit %d exceeds what the open-file limit allows (ulimit -Hn); holding %d connections",
            wanted,
            max(allowed, 1),
        )
    return max(1, min(wanted, allowed))


class _Parser(HTTPRequestParser):  # type: ignore[misc]
    """waitress's parser, which notes when a request's first byte came,
    refuses two framings of one body, and holds each body to its path's cap
    (``jobdeck.web.body_limits``: the bulk enqueue's is larger), counting a
    chunked body's bytes, not its framing, as the app and granian do."""

    adj: Any
    error: Any

    def __init__(self, adj: Any) -> None:
        super().__init__(adj)
        self.began = time.monotonic()
        self.body_cap = adj.max_request_body_size - 1
        """The bytes this request's body may have (its path's cap, once the headers are in)."""

    def parse_header(self, header_plus: bytes) -> None:
        super().parse_header(header_plus)
        framed = self.chunked or "TRANSFER_ENCODING" in self.headers
        if framed and "CONTENT_LENGTH" in self.headers:
            raise ParsingError("Content-Length and Transfer-Encoding together")
        self.body_cap = getattr(self.adj, "larger_bodies", {}).get(self.path, self.body_cap)
        if self.chunked:  # waitress counts the chunks' framing against the cap: allow for it, count the bytes below
            self.adj = _with_body_cap(self.adj, 2 * self.body_cap + CHUNK_FRAMING)
        elif self.body_cap != self.adj.max_request_body_size - 1:
            self.adj = _with_body_cap(self.adj, self.body_cap)

    def received(self, data: bytes) -> int:
        consumed: int = super().received(data)
        over = self.chunked and self.error is None and self.body_rcv is not None and len(self.body_rcv) > self.body_cap
        if over or type(self.error) is RequestEntityTooLarge:  # declared, or a chunked body past the cap
            self.error = _TooLarge(too_large(self.body_cap, self.path))
            self.completed = True
        return consumed


class _TooLarge(RequestEntityTooLarge):  # type: ignore[misc]
    """waitress's 413 in the app's JSON and words (``too_large``), not its text."""

    def to_response(self, ident: str | None = None) -> tuple[str, list[tuple[str, str]], bytes]:
        body = (json.dumps({"error": self.body}) + "\n").encode()
        return f"{self.code} {self.reason}", [("Content-Type", "application/json")], body


class _Channel(HTTPChannel):  # type: ignore[misc]
    parser_class = _Parser

    def cut_if_slow(self, began_before: float, timeout: float) -> None:
        """On the loop's thread: answer 408 and close once flushed if the
        request being received began before ``began_before``. Skipped while
        an earlier request of this connection is being answered: its
        response goes first, and the next sweep comes back."""
        with self.requests_lock:
            request: Any = self.request  # type: ignore[has-type]
            if request is None or self.requests or request.began >= began_before:
                return
            body = (
                json.dumps({"error": f"the request did not arrive within {timeout:g} s (http_body_timeout)"}) + "\n"
            ).encode()
            answer = (
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            with self.outbuf_lock:
                self.outbufs[-1].append(answer)
                self.current_outbuf_count += len(answer)
                self.total_outbufs_len += len(answer)
            self.request = None
            self.close_when_flushed = True


def _with_body_cap(adj: Any, cap: int) -> Any:
    """waitress's settings ``adj`` with another body cap (it refuses a body
    of ``max_request_body_size`` bytes or more)."""
    larger = copy.copy(adj)
    larger.max_request_body_size = cap + 1
    return larger


class HttpServer:
    """waitress on a thread of its own, stopped from any other thread."""

    def __init__(self, app: Any, config: Config) -> None:
        timeout = max(1, math.ceil(config.http_channel_timeout))
        body_timeout = config.http_body_timeout
        self.server: Any = create_server(
            app,
            host=config.host,
            port=config.port,
            threads=config.http_threads,
            connection_limit=connection_limit(config),
            # waitress's own default is 1 GB, spooled to a file before the app refuses it
            max_request_body_size=body_cap(config) + 1,
            channel_timeout=timeout,
            cleanup_interval=max(1, min(30, timeout // 2, math.floor(body_timeout / 4))),
            asyncore_use_poll=True,
            ident="jobdeck",
        )
        self.server.channel_class = _Channel
        self.server.adj.larger_bodies = larger_bodies(config)
        idle_sweep = self.server.maintenance

        def maintenance(now: float) -> None:
            idle_sweep(now)
            began_before = time.monotonic() - body_timeout
            for channel in list(self.server.active_channels.values()):
                if isinstance(channel, _Channel):
                    channel.cut_if_slow(began_before, body_timeout)

        self.server.maintenance = maintenance
        self._thread = threading.Thread(target=self._run, name="jobdeck-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.effective_port)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.server.run()
        except Exception:
            log.exception("the HTTP server loop failed")

    def stop(self, drain: float) -> None:
        """Stop accepting, give requests in progress up to ``drain`` seconds,
        then close every connection and end the loop. If the loop no longer
        answers (a dead trigger), give up waiting for it: the process is
        exiting, and its thread is a daemon."""
        server = self.server
        self._in_loop(lambda: wasyncore.dispatcher.close(server))  # the listening socket
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=drain)
        self._in_loop(lambda: wasyncore.close_all(server._map))
        self._thread.join(timeout=max(1.0, drain))
        if self._thread.is_alive():
            log.warning("the HTTP server loop did not stop; exiting without it")

    def _in_loop(self, thunk: Any) -> None:
        """Run ``thunk`` on the loop's thread, between two polls."""
        if not self._thread.is_alive():
            return
        try:
            self.server.trigger.pull_trigger(thunk)
        except OSError:  # the trigger is closed: nothing will run there any more
            log.warning("the HTTP server's trigger is closed")
