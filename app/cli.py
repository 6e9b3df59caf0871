"""The ``jobdeck`` command: serve, worker, enqueue, jobs, init-db, db."""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from app.config import Config, ConfigError, load


def _config(demo: bool, **overrides: Any) -> Config:
    values = {k: v for k, v in overrides.items() if v is not None}
    if demo:
        values["demo"] = True
    try:
        return load(overrides=values)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _app(config: Config):  # type: ignore[no-untyped-def]
    from app import create_app

    try:
        return create_app(config)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _logging(level: str) -> None:
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
        record.message = _escape_controls(record.message)
        return super().formatMessage(record)


def _escape_controls(text: str) -> str:
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


@click.group()
def main() -> None:
    """Jobdeck: a background job queue with an operator dashboard."""


@main.command()
@click.option("--demo", is_flag=True, help="Register the demo job types.")
@click.option("--bind", help="HOST:PORT (default 127.0.0.1:8000).")
@click.option("--workers", type=int, help="Embedded worker threads (0: none).")
@click.option("--log-level", default="info", show_default=True)
def serve(demo: bool, bind: str | None, workers: int | None, log_level: str) -> None:
    """Serve the dashboard and API with embedded workers and the scheduler.

    SIGTERM or Ctrl-C stops it within ``shutdown_grace``; a second one
    releases the running jobs at once (``app.shutdown``)."""
    from app.runtime import Runtime
    from app.shutdown import ShutdownSignals
    from app.web.server import HttpServer

    _logging(log_level)
    config = _config(demo, bind=bind, workers=workers)
    refuse_exposed(config)
    app = _app(config)
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
    _stop_on_signals(runtime, signals, config, server.stop)
    if runtime.exit_status:  # exit_when_unhealthy: a supervisor restarts us
        sys.exit(runtime.exit_status)


def refuse_exposed(config: Config) -> None:
    """Refuse to listen beyond loopback without credentials (the same check as wsgi.py)."""
    from app.web.exposure import exposure_problem

    problem = exposure_problem(config)
    if problem:
        raise click.ClickException(problem)


def _stop_on_signals(runtime: Any, signals: Any, config: Config, stop_taking_work: Any = None) -> None:
    from app.shutdown import run_until_signalled

    try:
        run_until_signalled(
            runtime, signals, config.shutdown_grace, stop_taking_work=stop_taking_work,
            say=lambda text: click.echo(text, err=True),
        )  # fmt: skip
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.option("--demo", is_flag=True, help="Register the demo job types.")
@click.option("--workers", type=int, help="Worker threads.")
@click.option("--log-level", default="info", show_default=True)
def worker(demo: bool, workers: int | None, log_level: str) -> None:
    """Run the worker pool (and the scheduler) without the web server.

    Stops on signals like ``serve``."""
    from app.runtime import Runtime
    from app.shutdown import ShutdownSignals

    _logging(log_level)
    config = _config(demo, workers=workers)
    if config.workers <= 0:
        raise click.ClickException("workers: must be > 0 for `jobdeck worker`")
    app = _app(config)
    runtime = Runtime.for_app(app)
    signals = ShutdownSignals()
    signals.install()
    runtime.start()
    click.echo(f"Jobdeck worker running with {config.workers} threads", err=True)
    _stop_on_signals(runtime, signals, config)
    if runtime.exit_status:  # exit_when_unhealthy: a supervisor restarts us
        sys.exit(runtime.exit_status)


@main.command()
@click.argument("job_type")
@click.option("--payload", default="{}", help="The payload as a JSON object.")
@click.option("--priority", help="An integer or low|medium|high|critical.")
@click.option("--delay", type=float, help="Seconds from now.")
@click.option("--key", help="Idempotency key.")
@click.option("--queue", help="Queue name.")
@click.option("--max-retries", type=int)
@click.option("--demo", is_flag=True, help="Accept the demo job types.")
def enqueue(job_type: str, payload: str, priority: str | None, delay: float | None, key: str | None,
            queue: str | None, max_retries: int | None, demo: bool) -> None:  # fmt: skip
    """Enqueue a job and print it as JSON."""
    from app import deck_of
    from app.errors import InvalidField, JobdeckError
    from app.validation import loads
    from app.web.serialize import job_json

    try:
        data = loads(payload, "payload")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    except InvalidField as exc:
        raise click.BadParameter(f"not an acceptable payload: {exc}", param_hint="--payload") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    deck = deck_of(_app(_config(demo)))
    try:
        job, created = deck.enqueue(
            job_type, data, priority=priority, queue=queue, max_retries=max_retries,
            idempotency_key=key, delay_seconds=delay,
        )  # fmt: skip
    except JobdeckError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(job_json(job, deck.clock()), indent=2))
    if not created:
        click.echo(f"idempotency key {key!r} already existed: this is the existing job", err=True)


@main.command()
@click.option("--status", help="Only jobs in this state.")
@click.option("--type", "job_type", help="Only jobs of this type.")
@click.option("--limit", default=20, show_default=True)
def jobs(status: str | None, job_type: str | None, limit: int) -> None:
    """List recent jobs."""
    from app import deck_of
    from app.states import State
    from app.store import JobFilter

    if status is not None and status not in {s.value for s in State}:
        raise click.BadParameter(f"one of {', '.join(s.value for s in State)}", param_hint="--status")
    deck = deck_of(_app(_config(False)))
    rows = deck.store.list_jobs(
        JobFilter(status=State(status) if status else None, type=job_type, limit=limit), deck.clock()
    )
    for job in rows:
        error = (job.error or "").splitlines()[0][:60] if job.error else ""
        click.echo(f"{job.id:>8}  {job.status.value:<9}  {job.type:<24} {job.retry_count}/{job.max_retries}  {error}")
    if not rows:
        click.echo("no jobs", err=True)


@main.command("hash-password")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (for scripts).")
def hash_password(password_stdin: bool) -> None:
    """Print a password hash for a [users.NAME] table of the config."""
    from werkzeug.security import generate_password_hash

    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        raise click.ClickException("password: use at least 8 characters")
    click.echo(generate_password_hash(password))
    click.echo(
        'add it to jobdeck.toml as:  [users.NAME]  password_hash = "..."  role = "operator" (or "viewer")', err=True
    )


@main.command("init-db")
def init_db() -> None:
    """Create the database schema."""
    config = _config(False)
    _app(config)
    click.echo(f"database ready: {config.resolved_database_url()}")


@main.group()
def db() -> None:
    """Database schema migrations (Alembic; revisions in app/store/migrations)."""


@contextmanager
def _engine() -> Iterator[Any]:
    from app.store.engine import make_engine

    config = _config(False)
    engine = make_engine(config.resolved_database_url(), synchronous=config.sqlite_synchronous, pool_size=2)
    try:
        yield engine
    finally:
        engine.dispose()


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Upgrade the schema (to head by default). Safe while Jobdeck runs, and
    from several hosts at once: one migrates, the others wait and find it done."""
    from app.store import migrate

    with _engine() as engine:
        before = migrate.current(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current(engine)
    click.echo(f"schema at {', '.join(sorted(after))} (was {', '.join(sorted(before)) or 'unversioned'})")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Downgrade the schema to REVISION (e.g. 0001, or -1)."""
    from app.store import migrate

    with _engine() as engine:
        migrate.downgrade(engine, revision)
        click.echo(f"schema at {', '.join(sorted(migrate.current(engine))) or 'base'}")


@db.command("current")
def db_current() -> None:
    """Show the schema revision of the database and the code's head."""
    from app.store import migrate

    with _engine() as engine:
        have = migrate.current(engine)
    click.echo(f"database: {', '.join(sorted(have)) or 'unversioned'}; code: {', '.join(sorted(migrate.heads()))}")
    if have != migrate.heads():
        sys.exit(1)


@db.command("revision")
@click.option("-m", "--message", required=True, help="What the revision changes.")
@click.option("--empty", is_flag=True, help="An empty revision instead of autogenerating from the models.")
def db_revision(message: str, empty: bool) -> None:
    """Write a new revision into app/store/migrations/versions, autogenerated from
    the difference between app/store/models.py and the database at head. Point
    JOBDECK_DATABASE_URL at a scratch database (a fresh SQLite file will do)."""
    from app.store import migrate

    with _engine() as engine:
        try:
            path = migrate.revision(engine, message, autogenerate=not empty)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {path}; review it (ALTERs on SQLite go through batch_alter_table) and commit it")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
