"""The long-running commands: ``serve`` (the web server with embedded
workers) and ``worker``, with their logging and signal handling."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
from typing import Any

import click
from jobdeck import docs
from jobdeck.cli.base import command_app, command_config, command_deck, escape_controls, main
from jobdeck.core.config import HTTP_SERVERS, Config
from jobdeck.core.structured_logs import use_log_format


def setup_logging(level: str) -> None:
    # `kill -USR1 <pid>` prints every thread's stack: for a process that seems stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        h.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # waitress warns "Task queue depth is N" for every request that waits for
    # a thread: under load, a formatted log line per request for every endpoint.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)


class OneLineFormatter(logging.Formatter):
    """Each record's message on one line: a job's error text is user data,
    and a newline in it could forge a log line of its own ("... INFO
    jobdeck.worker: ..."). Newlines and other control characters in the
    message are escaped; a traceback attached to the record stays as is."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


@main.command(short_help="Serve the dashboard, the API, workers and the scheduler.")
@click.option("--demo", is_flag=True, help="Register the demo job types.")
@click.option("--bind", help="HOST:PORT (default 127.0.0.1:8000).")
@click.option("--workers", type=int, help="Embedded worker threads (0: none).")
@click.option(
    "--server",
    "http_server",
    type=click.Choice(HTTP_SERVERS),
    help="The HTTP server (setting http_server; default granian, waitress the pure-Python fallback).",
)
@click.option("--log-level", default="info", show_default=True)
def serve(demo: bool, bind: str | None, workers: int | None, http_server: str | None, log_level: str) -> None:
    """Serve the dashboard and API with embedded workers and the scheduler.

    SIGTERM or Ctrl-C stops it within shutdown_grace seconds; a second one
    releases the running jobs at once (see app/web/granian_server.py, and
    app/shutdown.py for waitress)."""
    from jobdeck.runtime import Runtime
    from jobdeck.shutdown import ShutdownSignals, leave_stuck_threads
    from jobdeck.web.server import HttpServer

    setup_logging(log_level)
    config = command_config(demo, bind=bind, workers=workers, http_server=http_server)
    use_log_format(config.log_format)
    refuse_exposed(config)
    app = command_app(config)
    if config.http_server == "granian":
        _serve_granian(app, config)
        return
    runtime = Runtime.for_app(app)
    try:
        server = HttpServer(app, config)
    except OSError as exc:  # the port is taken, or the address is not this host's
        raise click.ClickException(f"bind: cannot listen on {config.bind}: {exc.strerror or exc}") from None
    signals = ShutdownSignals()
    signals.install()  # before anything runs that a signal must stop gracefully
    runtime.start()
    server.start()
    click.echo(f"Jobdeck serving on http://{config.bind} with {config.workers} workers", err=True)
    click.echo(docs.where(), err=True)
    _stop_on_signals(runtime, signals, config, server.stop)
    leave_stuck_threads(runtime.exit_status)
    if runtime.exit_status:  # exit_when_unhealthy: a supervisor restarts us
        sys.exit(runtime.exit_status)


def _serve_granian(app: Any, config: Config) -> None:
    """granian's supervisor in this process, the app and runtime in its one
    worker process (``jobdeck.web.granian_server``). The app built here has
    checked the configuration and migrated the database; its connections
    are closed before the worker is forked."""
    from jobdeck.web import granian_server

    try:
        import granian  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "http_server granian: granian is not installed (pip install granian, or --server waitress)"
        ) from None
    app.extensions["jobdeck"].store.engine.dispose()
    try:
        granian_server.check_bindable(config)
    except OSError as exc:  # the port is taken, or the address is not this host's
        raise click.ClickException(f"bind: cannot listen on {config.bind}: {exc.strerror or exc}") from None
    click.echo(f"Jobdeck serving on http://{config.bind} (granian) with {config.workers} workers", err=True)
    click.echo(docs.where(), err=True)
    granian_server.serve(config)


def refuse_exposed(config: Config) -> None:
    """Refuse to listen beyond loopback without credentials (the same check as wsgi.py)."""
    from jobdeck.web.exposure import exposure_problem

    problem = exposure_problem(config)
    if problem:
        raise click.ClickException(problem)


def _stop_on_signals(runtime: Any, signals: Any, config: Config, stop_taking_work: Any = None) -> None:
    from jobdeck.shutdown import run_until_signalled

    try:
        run_until_signalled(
            runtime, signals, config.shutdown_grace, stop_taking_work=stop_taking_work,
            say=lambda text: click.echo(text, err=True),
        )  # fmt: skip
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None


@main.command(short_help="Run workers and the scheduler, without the web server.")
@click.option("--demo", is_flag=True, help="Register the demo job types.")
@click.option("--workers", type=int, help="Worker threads.")
@click.option("--log-level", default="info", show_default=True)
def worker(demo: bool, workers: int | None, log_level: str) -> None:
    """Run the worker pool (and the scheduler) without the web server.

    Stops on signals like serve."""
    from jobdeck.runtime import Runtime
    from jobdeck.shutdown import ShutdownSignals, leave_stuck_threads

    setup_logging(log_level)
    config = command_config(demo, workers=workers)
    use_log_format(config.log_format)
    if config.workers <= 0:
        raise click.ClickException("workers: must be > 0 for `jobdeck worker`")
    runtime = Runtime(command_deck(config))  # no Flask app: a worker serves nothing
    signals = ShutdownSignals()
    signals.install()
    runtime.start()
    click.echo(f"Jobdeck worker running with {config.workers} threads", err=True)
    _stop_on_signals(runtime, signals, config)
    leave_stuck_threads(runtime.exit_status)
    if runtime.exit_status:  # exit_when_unhealthy: a supervisor restarts us
        sys.exit(runtime.exit_status)
