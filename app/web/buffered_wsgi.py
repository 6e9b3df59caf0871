"""The WSGI app behind granian's RSGI interface, each request's body read
whole, under a deadline, before the request takes one of ``http_threads``.

granian's own WSGI interface hands a request to a thread as soon as its
headers are in, and ``wsgi.input`` reads the body on that thread: 16
clients sending a body at one byte a second held all 16 threads, and
``/api/health`` and every enqueue timed out for as long as they dripped.
Here the body is read on granian's event loop, where a connection waiting
for bytes costs a coroutine, not a thread. A body that has not arrived
``http_body_timeout`` seconds after the headers is answered 408 and its
connection closed; a declared body over the app's limit
(``MAX_CONTENT_LENGTH``, or a larger one for the paths of ``larger_bodies``:
``jobdeck.web.body_limits``) is not read at all, and the app answers 413 from
its ``Content-Length``. Only a whole request reaches a thread, so however
many clients are slow, the threads serve the others; a body that breaks
off (its client killed mid-upload) never reaches the app (``_read``).

A request carrying both ``Content-Length`` and ``Transfer-Encoding`` never
reaches the app with both: granian (hyper) frames it by the
``Transfer-Encoding`` alone, as RFC 9112 allows, and closes the connection
after the answer, so nothing smuggled after the chunked body is read.

The environ is the one granian's WSGI interface builds (``PATH_INFO``
decoded from the percent-encoded path, repeated headers joined with
commas, cookies with semicolons). Responses are sent whole: Jobdeck
streams none.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("jobdeck.http")

Headers = list[tuple[str, str]]
_JSON_CLOSE: Headers = [("content-type", "application/json"), ("connection", "close")]


class BodyCut(Exception):
    """The request body ended before it was whole: answered 400, never run."""

    message = "the request body ended before it was whole (the connection closed mid-body): nothing was done"


def _error(message: str) -> bytes:
    return (json.dumps({"error": message}) + "\n").encode()


class BufferedWsgi:
    """An RSGI application (``__rsgi__``) serving ``app`` on ``threads`` threads."""

    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        *,
        threads: int,
        body_timeout: float,
        max_body: int,
        larger_bodies: Mapping[str, int] | None = None,
        serving: Callable[[asyncio.AbstractEventLoop], None] | None = None,
    ):
        self.app = app
        self._serving = serving
        """Called with granian's loop when granian is about to run it."""
        self.body_timeout = body_timeout
        self.max_body = max_body
        self.larger_bodies = dict(larger_bodies or {})
        """Paths whose body may pass ``max_body``, and their caps (the bulk enqueue's)."""
        self._threads = threads
        self._requests: queue.SimpleQueue[tuple[Any, Any, bytes | None, int, asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._answered: list[asyncio.Future[None]] = []
        """Requests the threads have answered, for the loop to resolve in
        one wake-up however many there are (``_resolve``)."""
        self._answered_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[threading.Thread] = []
        self._base: dict[str, Any] = {
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SCRIPT_NAME": "",
            "SERVER_SOFTWARE": "Granian",
            "wsgi.errors": sys.stderr,
            "wsgi.input_terminated": True,
            "wsgi.multiprocess": False,
            "wsgi.multithread": True,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
        }

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """granian calls this before it serves: the threads start."""
        self._loop = loop
        for n in range(self._threads):
            worker = threading.Thread(target=self._serve, name=f"jobdeck-http-{n}", daemon=True)
            worker.start()
            self._workers.append(worker)
        if self._serving is not None:
            self._serving(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        """granian calls this once every request has been answered: the threads end."""
        for _ in self._workers:
            self._requests.put(None)
        for worker in self._workers:
            worker.join()

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        """On granian's event loop: read the body, queue the request for a
        thread, and return once the thread has answered it (granian answers
        500 for a request whose coroutine ends unanswered)."""
        headers = scope.headers
        declared = headers.get("content-length")
        cap = self.larger_bodies.get(scope.path, self.max_body)
        body: bytes | None = b""
        if (declared is not None and declared != "0") or "transfer-encoding" in headers:
            if declared is not None and declared.isdigit() and int(declared) > cap:
                body = None  # not read: the app answers 413 from the declared length
            else:
                try:
                    async with asyncio.timeout(self.body_timeout):
                        body = await self._read(protocol, cap)
                    if body is not None and declared is not None and declared.isdigit() and len(body) != int(declared):
                        raise BodyCut
                except TimeoutError:
                    message = f"the request body did not arrive within {self.body_timeout:g} s (http_body_timeout)"
                    protocol.response_bytes(408, _JSON_CLOSE, _error(message))
                    return
                except BodyCut:
                    protocol.response_bytes(400, _JSON_CLOSE, _error(BodyCut.message))
                    return
        assert self._loop is not None
        answered: asyncio.Future[None] = self._loop.create_future()
        self._requests.put((scope, protocol, body, cap, answered))
        await answered

    def _serve(self) -> None:
        """One of the threads: answer queued requests, each from the thread
        (the response leaves at once, without waiting for the loop)."""
        while (request := self._requests.get()) is not None:
            scope, protocol, body, cap, answered = request
            try:
                status, headers, content = self._call(self._environ(scope, body, cap))
            except Exception:
                log.exception("%s %s: the WSGI call failed", scope.method, scope.path)
                status, headers, content = 500, _JSON_CLOSE, _error("internal error")
            try:
                protocol.response_bytes(status, headers, content)
            finally:
                with self._answered_lock:
                    self._answered.append(answered)
                    first = len(self._answered) == 1
                if first:
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        """On the loop: end the coroutines of every request answered so far."""
        with self._answered_lock:
            answered, self._answered = self._answered, []
        for future in answered:
            if not future.done():
                future.set_result(None)

    async def _read(self, protocol: Any, cap: int) -> bytes | None:
        """The whole body, or None once it exceeds ``cap`` (a chunked body
        declares no length); ``BodyCut`` when it ended before it was whole.

        granian's iterator does not raise when the body breaks off (the
        client closed or reset the connection mid-body, a chunked body
        without its last chunk): it yields an empty chunk for the error,
        then the empty chunk that ends every body, and stops. A body cut
        short is never the app's to run (its cut may fall where the JSON
        parses, in trailing white space). Trailers also come as an empty
        chunk, so a chunked body with trailers is refused too."""
        chunks: list[bytes] = []
        size = 0
        empty = 0
        async for chunk in protocol:
            if not chunk:
                empty += 1
                continue
            size += len(chunk)
            if size > cap:
                return None
            chunks.append(chunk)
        if empty > 1:
            raise BodyCut
        return b"".join(chunks)

    def _environ(self, scope: Any, body: bytes | None, cap: int) -> dict[str, Any]:
        headers = scope.headers
        declared = headers.get("content-length")
        environ = dict(self._base)
        server_host, _, server_port = scope.server.rpartition(":")
        environ.update(
            SERVER_PROTOCOL="HTTP/" + scope.http_version,
            SERVER_NAME=server_host.strip("[]"),
            SERVER_PORT=server_port,
            REMOTE_ADDR=scope.client.rpartition(":")[0].strip("[]"),
            REQUEST_METHOD=scope.method,
            PATH_INFO=scope.path.encode("utf-8").decode("latin-1"),
            QUERY_STRING=scope.query_string.encode("utf-8").decode("latin-1"),
        )
        environ["wsgi.url_scheme"] = scope.scheme
        if body is None:  # too large, not read
            environ["CONTENT_LENGTH"] = declared or str(cap + 1)
            environ["wsgi.input"] = io.BytesIO()
        else:
            environ["wsgi.input"] = io.BytesIO(body)
            if body or declared is not None:
                environ["CONTENT_LENGTH"] = str(len(body))
        for name, value in headers.items():
            if name == "content-type":
                environ.setdefault("CONTENT_TYPE", value)
            elif name != "content-length" and name != "transfer-encoding":
                key = "HTTP_" + name.replace("-", "_").upper()
                joined = environ.get(key)
                environ[key] = value if joined is None else joined + (";" if name == "cookie" else ",") + value
        if "HTTP_HOST" not in environ:
            environ["HTTP_HOST"] = scope.authority or ""
        return environ

    def _call(self, environ: dict[str, Any]) -> tuple[int, Headers, bytes]:
        """On one of the threads: the WSGI call, its response collected whole."""
        started: list[Any] = []
        chunks: list[bytes] = []

        def start_response(status: str, headers: Headers, exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return chunks.append

        result = self.app(environ, start_response)
        try:
            for chunk in result:
                if chunk:
                    chunks.append(chunk)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = started
        return int(status[:3]), list(headers), b"".join(chunks)
