"""granian (a Rust HTTP server with a WSGI interface) as ``jobdeck serve``
runs it when ``http_server = "granian"``.

granian reads, parses and writes HTTP in Rust, outside the GIL; only the
WSGI call itself runs Python, on ``http_threads`` blocking threads. Idle
connections are tokio tasks: they hold no thread, and a connection that
sends no request for ``http_channel_timeout`` seconds (at most 60, granian's
limit) is closed.

Processes: this process is granian's supervisor. It binds the socket and
forks exactly one worker process, which builds the app and starts the
runtime (worker pool and scheduler) once, in ``_load``; the supervisor
never starts one, so there is one pool per ``jobdeck serve`` as with
waitress. granian has no reloader here.

Stopping: SIGTERM or Ctrl-C reaches the supervisor, which passes SIGTERM
to the worker. The worker stops accepting, lets the requests in progress
finish, and on its way out (a ``multiprocessing`` finalizer, which runs
when the worker's serve loop returns) stops the runtime with
``shutdown_grace``: running jobs finish or are released. The supervisor
waits ``shutdown_grace`` plus ``KILL_MARGIN`` seconds before it kills the
worker. A second signal does not hurry the release as waitress's path
does (granian's worker handles the signals itself).

If the worker exits on its own (``exit_when_unhealthy``, or a crash), the
supervisor exits non-zero, so a process supervisor restarts ``jobdeck serve``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing.util
from functools import partial
from typing import Any

from app.config import Config

log = logging.getLogger("jobdeck.http")

KILL_MARGIN = 10
"""Seconds the supervisor gives the worker beyond ``shutdown_grace``
(the HTTP drain, stopping the scheduler) before it kills it."""

MAX_IDLE_SECONDS = 60
"""granian's upper bound on its header read timeout (60,000 ms)."""


def serve(config: Config) -> None:
    """Serve until signalled; returns after a graceful stop. Raises
    SystemExit (non-zero) if the worker exited on its own, OSError if the
    address cannot be bound."""
    from granian.constants import Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    from app.web.server import connection_limit

    connection_limit(config)  # raises the open-file limit for the idle connections
    idle_ms = min(MAX_IDLE_SECONDS, max(1, math.ceil(config.http_channel_timeout))) * 1000
    server = Server(
        "jobdeck",  # a name only: ``_load`` builds the app
        address=config.host,
        port=config.port,
        interface=Interfaces.WSGI,
        workers=1,
        blocking_threads=config.http_threads,
        http1_settings=HTTP1Settings(header_read_timeout=idle_ms),
        websockets=False,
        log_enabled=True,
        log_level=_granian_level(),
        respawn_failed_workers=False,
        workers_kill_timeout=math.ceil(config.shutdown_grace) + KILL_MARGIN,
    )
    server.serve(target_loader=partial(_load, config), wrap_loader=True)


def _load(config: Config, _target: str) -> Any:
    """In the worker process: the app, with this process's runtime started
    and its graceful stop registered for the worker's exit."""
    from app import create_app
    from app.runtime import Runtime

    app = create_app(config)
    runtime = Runtime.for_app(app)
    runtime.start()
    multiprocessing.util.Finalize(runtime, _stop, args=(runtime, config.shutdown_grace), exitpriority=10)
    return app


def _stop(runtime: Any, grace: float) -> None:
    log.info("HTTP stopped; finishing running jobs (up to %g s)", grace)
    runtime.stop(grace)
    if runtime.exit_status:  # exit_when_unhealthy: the supervisor sees a worker exit non-zero
        import os

        os._exit(runtime.exit_status)


def _granian_level() -> Any:
    from granian.log import LogLevels

    level = logging.getLogger().getEffectiveLevel()
    for name in ("debug", "info", "warning", "error", "critical"):
        if logging.getLevelName(name.upper()) >= level:
            return LogLevels(name)
    return LogLevels("critical")
