"""granian (a Rust HTTP server with a WSGI interface) as ``jobdeck serve``
runs it when ``http_server = "granian"``.

granian reads, parses and writes HTTP in Rust, outside the GIL. The app is
served through granian's RSGI interface (``jobdeck.web.buffered_wsgi``): a
request's body is read on granian's event loop, within
``http_body_timeout``, and only then does the WSGI call take one of
``http_threads`` threads, so slow clients hold no thread. Idle
connections are tokio tasks: they hold no thread, and a connection that
sends no request for ``http_channel_timeout`` seconds (at most 60, granian's
limit) is closed. granian holds ``http_connection_limit`` connections at
once; more wait to be accepted.

Processes: this process is granian's supervisor. It binds the socket and
forks exactly one worker process, which builds the app and starts the
runtime (worker pool and scheduler) once, in ``_load``; the supervisor
never starts one, so there is one pool per ``jobdeck serve`` as with
waitress. granian has no reloader here.

Stopping: SIGTERM, Ctrl-C or SIGHUP (there is no reload) reaches the
supervisor, which passes SIGTERM to the worker. The worker stops
accepting, lets the requests in progress finish, and on its way out (a
``multiprocessing`` finalizer, which runs when the worker's serve loop
returns) stops the runtime with
``shutdown_grace``: running jobs finish or are released. The supervisor
waits ``shutdown_grace`` plus ``KILL_MARGIN`` seconds before it kills the
worker. A second signal is passed on too: the worker releases its
running jobs at once, as with waitress (``jobdeck.shutdown``). The runtime's
grace is counted from the first signal, so the whole stop fits in
``shutdown_grace`` when the requests in progress end promptly.

If the worker exits on its own, the supervisor exits non-zero, so a process
supervisor restarts ``jobdeck serve``: 3 as with waitress when the worker
stopped itself as unhealthy (``exit_when_unhealthy``), 1 after another
exit. A stop that had to kill the worker at the kill timeout exits 1 too
(its running jobs were not released). A worker killed by a signal (a
crash, the OOM killer), before a stop or during one, takes the supervisor
with it by the same signal, and a killed supervisor takes its worker
(SIGKILL on the parent's death): either way ``jobdeck serve`` dies whole,
as one waitress process would, and the crash matrix holds for both.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from jobdeck.core.config import Config
from jobdeck.shutdown import leave_stuck_threads

log = logging.getLogger("jobdeck.http")

KILL_MARGIN = 10
"""Seconds the supervisor gives the worker beyond ``shutdown_grace``
(the HTTP drain, stopping the scheduler) before it kills it."""

_HELD: list[int] = []
"""In the worker: the signals that came before granian listened for them."""

MAX_IDLE_SECONDS = 60
"""granian's upper bound on its header read timeout (60,000 ms)."""


def serve(config: Config) -> None:
    """Serve until signalled; returns after a graceful stop. Raises
    SystemExit (non-zero) if the worker exited on its own. Call
    ``check_bindable`` first: granian reports a failed bind as a traceback."""
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.server import MPServer
    from jobdeck.web.server import connection_limit

    class Supervisor(MPServer):
        def signal_handler_interrupt(self, *args: Any, **kwargs: Any) -> None:
            if os.getpid() != self.pid:  # the worker, before ``_load``: the handler came with the fork
                _HELD.append(args[0] if args else signal.SIGTERM)
                return
            stops.value += 1
            if self.interrupt_signal:  # a second signal: the worker releases its running jobs now
                for worker in list(self.wrks):
                    with contextlib.suppress(ProcessLookupError, AttributeError, TypeError):
                        os.kill(worker.inner.pid, signal.SIGTERM)
                return
            deadline.value = time.monotonic() + config.shutdown_grace
            super().signal_handler_interrupt(*args, **kwargs)  # type: ignore[no-untyped-call]

        def signal_handler_reload(self, *args: Any, **kwargs: Any) -> None:
            """SIGHUP stops ``jobdeck serve`` as SIGTERM does. granian's reload
            forked a new worker, with a second runtime, while the old one
            still finished its jobs: two pools and two schedulers at once."""
            self.signal_handler_interrupt(*args, **kwargs)

        killed_at_timeout = False
        """granian killed a worker that outlived ``workers_kill_timeout``: its runtime never finished its stop."""
        ended_in_stop: tuple[int, ...] = ()
        """The exit codes of the workers that were running when the stop began (but one killed at the timeout)."""

        def _stop_workers(self) -> None:
            running = [w for w in self.wrks if w.is_alive()]  # type: ignore[no-untyped-call]
            killed: list[Any] = []
            for w in running:  # granian kills at the timeout through each worker's ``kill``: note which
                w.kill = partial(_noted_kill, w.kill, w, killed)  # type: ignore[method-assign]
            began = time.monotonic()
            super()._stop_workers()  # type: ignore[no-untyped-call]
            # granian also calls ``kill`` on a worker that has just exited, when
            # its liveness check races the exit ("Killing worker-1 after it
            # refused to gracefully stop" after a stop of 0.1 s): only a kill
            # at the timeout counts.
            timeout = self.workers_kill_timeout or 0
            self.killed_at_timeout = bool(killed) and time.monotonic() - began >= timeout - 1
            self.ended_in_stop = tuple(getattr(w.inner, "exitcode", None) or 0 for w in running if w not in killed)

        def shutdown(self, exit_code: int = 0) -> None:
            from jobdeck.runtime import EXIT_UNHEALTHY

            codes = [getattr(w.inner, "exitcode", None) for w in self.wrks]
            if EXIT_UNHEALTHY in codes:
                exit_code = EXIT_UNHEALTHY  # the worker stopped itself (exit_when_unhealthy): so does serve
            killed_by = next((-code for code in codes if code is not None and code < 0), None)
            try:
                super().shutdown(exit_code)  # type: ignore[no-untyped-call]
                # A clean exit would tell the service manager the stop went well.
                if self.killed_at_timeout:
                    log.error(
                        "the worker process did not stop within shutdown_grace + %d s and was killed: its running "
                        "jobs were not released (the stalled sweep rescues them)", KILL_MARGIN,
                    )  # fmt: skip
                    sys.exit(1)
                if killed_by is None:  # killed during the stop (a crash, the OOM killer): as before it
                    killed_by = next((-code for code in self.ended_in_stop if code < 0), None)
                if killed_by is None and any(self.ended_in_stop):
                    sys.exit(next(code for code in self.ended_in_stop if code))
            finally:
                if killed_by is not None:
                    _die_by(killed_by)

    deadline = multiprocessing.Value("d", 0.0, lock=False)
    """When the runtime's grace ends, counted from the first signal (a
    monotonic time, the same clock in both processes)."""
    stops = multiprocessing.Value("i", 0, lock=False)
    """How many stop signals the supervisor has had: the worker stops on the
    first and releases its running jobs on the second, however many copies
    reach it (a stop begun before granian listened, or a service manager
    that signals every process of the group)."""
    connections = connection_limit(config)  # also raises the open-file limit for the idle connections
    idle_ms = min(MAX_IDLE_SECONDS, max(1, math.ceil(config.http_channel_timeout))) * 1000
    server = Supervisor(
        "jobdeck",  # a name only: ``_load`` builds the app
        address=config.host,
        port=config.port,
        interface=Interfaces.RSGI,
        loop=Loops.uvloop if importlib.util.find_spec("uvloop") else Loops.asyncio,  # the faster loop (pyproject)
        workers=1,
        backpressure=connections,
        http1_settings=HTTP1Settings(header_read_timeout=idle_ms),
        websockets=False,
        log_enabled=True,
        log_level=_granian_level(),
        respawn_failed_workers=False,
        workers_kill_timeout=math.ceil(config.shutdown_grace) + KILL_MARGIN,
    )
    server.serve(target_loader=partial(_load, config, deadline, stops), wrap_loader=True)


def _noted_kill(kill: Callable[[], None], worker: Any, killed: list[Any]) -> None:
    """A worker's ``kill``, noted in ``killed`` first (granian kills at its kill timeout only)."""
    killed.append(worker)
    kill()


def _die_by(signum: int) -> None:
    """The worker was killed by ``signum`` (a crash, the OOM killer): so is
    this process, once granian has shut down, so whatever supervises
    ``jobdeck serve`` sees the crash for what it is, as with waitress."""
    log.error("the worker process was killed by signal %d; so is jobdeck serve", signum)
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def check_bindable(config: Config) -> None:
    """Raise OSError if ``config.bind`` cannot be listened on (taken, or not
    this host's address): granian reports that from Rust, as a traceback."""
    import socket

    for family, kind, proto, _, address in socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        return


def _load(config: Config, deadline: Any, stops: Any, _target: str) -> Any:
    """In the worker process: the app, with this process's runtime started
    and its graceful stop registered for the worker's exit. The worker
    leaves the supervisor's process group, so a terminal's Ctrl-C reaches
    the supervisor alone (which passes on the first and second signal), and
    dies with the supervisor (``_die_with_parent``)."""
    from jobdeck import create_app
    from jobdeck.runtime import Runtime
    from jobdeck.web.body_limits import larger_bodies
    from jobdeck.web.buffered_wsgi import BufferedWsgi

    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with_parent()
    _hold_signals()
    app = create_app(config)
    runtime = Runtime.for_app(app)
    runtime.start()
    multiprocessing.util.Finalize(
        runtime, _stop, args=(runtime, config.shutdown_grace, deadline, stops), exitpriority=10
    )
    return BufferedWsgi(
        app,
        threads=config.http_threads,
        body_timeout=config.http_body_timeout,
        max_body=app.config["MAX_CONTENT_LENGTH"],
        larger_bodies=larger_bodies(config),
        serving=partial(_serving, stops),
    )


def _hold_signals() -> None:
    """Keep SIGTERM and SIGINT in ``_HELD`` instead of acting on them.

    granian listens for its worker's signals on its event loop, and arms
    that only after ``_load`` returns; a signal that comes before the loop
    runs is lost. Until then, a SIGTERM from the supervisor met first the
    supervisor's handlers that the fork had copied, then granian's idle
    loop: either way the stop never began, the runtime ran jobs on, and the
    supervisor killed the worker ``shutdown_grace`` + ``KILL_MARGIN``
    seconds later. So signals are held from the fork on (``Supervisor``)
    until the loop runs, and ``_deliver`` stops the worker then."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: _HELD.append(number))


def _serving(stops: Any, loop: Any) -> None:
    """granian has armed its handlers (``BufferedWsgi.__rsgi_init__``), but
    its loop does not run yet: hold signals until it does."""
    armed = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    _hold_signals()
    loop.call_soon(_deliver, armed, stops)


def _deliver(armed: dict[int, Any], stops: Any) -> None:
    """On granian's running loop: its handlers back, and a stop that began
    while the worker started (a signal held here, or one the supervisor had
    and granian's idle loop lost) stops it now, as it would have then."""
    for signum, handler in armed.items():
        signal.signal(signum, handler)
    if _HELD or stops.value:
        os.kill(os.getpid(), signal.SIGTERM)
    _HELD.clear()


def _stop(runtime: Any, grace: float, deadline: Any, stops: Any) -> None:
    """The worker's serve loop returned (SIGTERM from the supervisor; HTTP
    requests in progress have been answered): stop the runtime within what
    is left of the grace. The supervisor's second signal releases the
    running jobs now, whether it came before this point or comes later."""

    def hurry_on_the_second(_signum: int, _frame: Any) -> None:
        if stops.value >= 2:
            runtime.hurry()

    signal.signal(signal.SIGTERM, hurry_on_the_second)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    left = deadline.value - time.monotonic() if deadline.value else grace
    print("shutting down: finishing running jobs (signal again to release them now)", file=sys.stderr, flush=True)
    if stops.value >= 2:
        runtime.hurry()
    runtime.stop(max(0.0, min(grace, left)))
    if runtime.exit_status:  # exit_when_unhealthy: the supervisor sees a worker exit non-zero
        os._exit(runtime.exit_status)
    leave_stuck_threads(0)  # a maintenance loop blocked on a dropped connection is not waited for


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the supervisor) dies, so
    a killed ``jobdeck serve`` is gone whole, as a waitress one is: its held
    jobs wait for the stalled sweep, and a restarted ``serve`` binds the port
    at once. (A graceful stop here kept the listening socket and the pool
    for up to ``shutdown_grace`` after the supervisor had gone.)"""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _granian_level() -> Any:
    from granian.log import LogLevels

    level = logging.getLogger().getEffectiveLevel()
    for name in ("debug", "info", "warning", "error", "critical"):
        if logging.getLevelName(name.upper()) >= level:
            return LogLevels(name)
    return LogLevels("critical")
