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

The loop runs on its own thread; the main thread waits for signals
(``app.shutdown``) and stops it through waitress's trigger, so the stop
runs inside the loop, between two polls, never as an exception.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from waitress import create_server, wasyncore

from app.config import Config

log = logging.getLogger("jobdeck.http")

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


class HttpServer:
    """waitress on a thread of its own, stopped from any other thread."""

    def __init__(self, app: Any, config: Config) -> None:
        timeout = max(1, math.ceil(config.http_channel_timeout))
        self.server: Any = create_server(
            app,
            host=config.host,
            port=config.port,
            threads=config.http_threads,
            connection_limit=connection_limit(config),
            channel_timeout=timeout,
            cleanup_interval=max(1, min(30, timeout // 2)),
            asyncore_use_poll=True,
            ident="jobdeck",
        )
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
