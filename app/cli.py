"""The ``jobdeck`` command: serve, worker, enqueue, jobs, show, retry,
discard, hash-password, init-db, db."""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from jobdeck import docs
from jobdeck.core.config import HTTP_SERVERS, Config, ConfigError, load
from jobdeck.core.states import ALL_STATES, CLAIMABLE, SOURCES, State, Transition
from jobdeck.core.structured_logs import use_log_format

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck
    from jobdeck.store import AttemptRecord, JobFilter, JobRecord, Store
    from jobdeck.store.audit import Tally


def _config(demo: bool, **overrides: Any) -> Config:
    values = {k: v for k, v in overrides.items() if v is not None}
    if demo:
        values["demo"] = True
    try:
        return load(overrides=values)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _app(config: Config):  # type: ignore[no-untyped-def]
    from jobdeck import create_app

    try:
        return create_app(config)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _deck(config: Config) -> Jobdeck:
    from jobdeck.deck import Jobdeck

    try:
        return Jobdeck.of(config)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


CREATE_HELP = "Make a new, empty SQLite database if there is none yet."


@contextmanager
def operator_deck(*, demo: bool = False, create: bool | None = None) -> Iterator[Jobdeck]:
    """The deck of a command that reads or moves jobs. It says which
    database it uses (one line on stderr, the password masked), and refuses
    to make a new SQLite file unless ``create``: run from another folder,
    the default ``./instance/jobdeck.db`` is a new, empty database in which
    every job seems gone and a new one waits for workers that never see it.
    ``create`` None: the command offers no ``--create`` (an empty database
    holds nothing for it to do)."""
    from jobdeck import deck_of
    from sqlalchemy.exc import ArgumentError

    config = _config(demo)
    url = config.resolved_database_url()
    try:
        click.echo(f"database: {masked(url)}", err=True)
        missing = missing_sqlite_file(url)
    except ArgumentError as exc:
        raise click.ClickException(f"invalid configuration: database_url: {exc}") from None
    if missing is not None and not create:
        hint = "point JOBDECK_DATABASE_URL (or database_url in jobdeck.toml) at it, or run from its folder"
        offer = "" if create is None else "; --create makes a new, empty one"
        raise click.ClickException(f"no database at {missing}: {hint}{offer}")
    deck = deck_of(_app(config))
    try:
        yield deck
    finally:
        deck.store.engine.dispose()


def masked(url: str) -> str:
    """The database URL with its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def missing_sqlite_file(url: str) -> Path | None:
    """The absolute path of the SQLite file ``url`` names when it does not
    exist yet; None for an existing file, in-memory SQLite or PostgreSQL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    path = Path(name).resolve()
    return None if path.exists() else path


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

    _logging(log_level)
    config = _config(demo, bind=bind, workers=workers, http_server=http_server)
    use_log_format(config.log_format)
    refuse_exposed(config)
    app = _app(config)
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

    _logging(log_level)
    config = _config(demo, workers=workers)
    use_log_format(config.log_format)
    if config.workers <= 0:
        raise click.ClickException("workers: must be > 0 for `jobdeck worker`")
    runtime = Runtime(_deck(config))  # no Flask app: a worker serves nothing
    signals = ShutdownSignals()
    signals.install()
    runtime.start()
    click.echo(f"Jobdeck worker running with {config.workers} threads", err=True)
    _stop_on_signals(runtime, signals, config)
    leave_stuck_threads(runtime.exit_status)
    if runtime.exit_status:  # exit_when_unhealthy: a supervisor restarts us
        sys.exit(runtime.exit_status)


@main.command(short_help="Enqueue a job and print it as JSON.")
@click.argument("job_type")
@click.option("--payload", default="{}", help="The payload as a JSON object.")
@click.option("--priority", help="An integer or low|medium|high|critical.")
@click.option("--delay", type=float, help="Seconds from now.")
@click.option("--key", help="Idempotency key.")
@click.option("--queue", help="Queue name.")
@click.option("--max-retries", type=int)
@click.option("--demo", is_flag=True, help="Accept the demo job types.")
@click.option("--create", is_flag=True, help=CREATE_HELP)
def enqueue(job_type: str, payload: str, priority: str | None, delay: float | None, key: str | None,
            queue: str | None, max_retries: int | None, demo: bool, create: bool) -> None:  # fmt: skip
    """Enqueue a job and print it as JSON."""
    from jobdeck.core.errors import InvalidField, JobdeckError, UnknownType
    from jobdeck.core.validation import loads
    from jobdeck.web.serialize import job_json

    try:
        data = loads(payload, "payload")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    except InvalidField as exc:
        raise click.BadParameter(f"not an acceptable payload: {exc}", param_hint="--payload") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    with operator_deck(demo=demo, create=create) as deck:
        try:
            enqueued = deck.enqueue(
                job_type, data, priority=priority, queue=queue, max_retries=max_retries,
                idempotency_key=key, delay_seconds=delay,
            )  # fmt: skip
            job, created = enqueued
        except UnknownType as exc:
            needs_demo = job_type.startswith("demo.") and not deck.config.demo
            raise click.ClickException(f"{exc} (the demo types need --demo)" if needs_demo else str(exc)) from None
        except JobdeckError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(json.dumps(job_json(job, deck.clock()), indent=2))
    if enqueued.duplicate:
        click.echo(f"a duplicate: job {job.id} holds the unique key {job.unique_key}; this is that job", err=True)
    elif not created:
        click.echo(f"idempotency key {key!r} already existed: this is the existing job", err=True)


# -- the operator's job commands: jobs, show, retry, discard --------------------


SCHEDULED = "scheduled"
"""Not a state: a pending job whose ``available_at`` is still ahead (the
dashboard's Scheduled tab)."""


def status_names(states: Iterable[State] = ALL_STATES) -> list[str]:
    """The ``--status`` vocabulary, in the state machine's order, with
    ``scheduled`` after ``pending`` (whose due jobs ``pending`` then names)."""
    wanted = set(states)
    names: list[str] = []
    for state in ALL_STATES:
        if state in wanted:
            names.append(state.value)
            if state is State.PENDING:
                names.append(SCHEDULED)
    return names


def job_filter(status: str | None, job_type: str | None, queue: str | None, limit: int = 50) -> JobFilter:
    """The store's filter for a ``--status`` name (``pending`` the due jobs,
    ``scheduled`` the future ones), a type and a queue."""
    from jobdeck.core.errors import InvalidField
    from jobdeck.core.validation import MAX_QUEUE_CHARS, MAX_TYPE_CHARS, check_text
    from jobdeck.store import JobFilter

    for value, name, most in ((job_type, "--type", MAX_TYPE_CHARS), (queue, "--queue", MAX_QUEUE_CHARS)):
        try:
            check_text(value or "", name, most)
        except InvalidField as exc:
            raise click.BadParameter(str(exc).removeprefix(f"{name}: "), param_hint=name) from None
    state = State.PENDING if status == SCHEDULED else State(status) if status else None
    scheduled = (status == SCHEDULED) if state is State.PENDING else None
    return JobFilter(status=state, scheduled=scheduled, type=job_type or None, queue=queue or None, limit=limit)


def shown_status(job: JobRecord, now: datetime) -> str:
    return SCHEDULED if job.is_scheduled(now) else job.status.value


def when(moment: datetime | None) -> str:
    """A time as the lists and the job page show it: UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def its_time(job: JobRecord) -> datetime | None:
    """The one time a list row shows besides its creation: when a waiting
    job is due, when a running one was claimed, when a finished one ended."""
    if job.status in CLAIMABLE:
        return job.available_at
    if job.status is State.RUNNING:
        return job.claimed_at
    return job.finished_at


def attempts_text(job: JobRecord) -> str:
    """Attempts made / allowed, counted as the dashboard counts them."""
    from jobdeck.present import attempts_allowed

    return f"{job.attempt}/{attempts_allowed(job)}"


def error_text(job: JobRecord, first_line_only: bool = False) -> str:
    """The job's error as the dashboard words it: on a completed job it is
    an earlier attempt's, so it says so."""
    text = (job.error or "").split("\n", 1)[0] if first_line_only else job.error or ""
    return f"failed before succeeding: {text}" if text and job.status is State.COMPLETED else text


def job_table(rows: list[JobRecord], now: datetime) -> list[str]:
    """The ``jobs`` listing: a header, then one line per job, columns sized
    to the widest value (type and queue capped), user text escaped."""
    cells = [
        [str(j.id), shown_status(j, now), shown(j.type, 40), shown(j.queue, 20), attempts_text(j),
         when(j.created_at), when(its_time(j)), shown(error_text(j, first_line_only=True), 60)]
        for j in rows
    ]  # fmt: skip
    header = ["ID", "STATUS", "TYPE", "QUEUE", "ATTEMPTS", "CREATED (UTC)", "DUE/CLAIMED/ENDED", "ERROR"]
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    return [
        "  ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in [header, *cells]
    ]


def shown(text: str, most: int | None = None) -> str:
    """User data (types, errors, payloads) made safe for a terminal: control
    characters escaped (an ESC sequence in an error message would otherwise
    drive the operator's terminal), cut to ``most`` characters."""
    text = _escape_controls(text)
    return text if most is None or len(text) <= most else text[: most - 1] + "…"


@main.command(short_help="List recent jobs, newest first.")
@click.option(
    "--status",
    type=click.Choice(status_names()),
    metavar="STATE",
    help=f"Only jobs in this state: {', '.join(status_names())}.",
)
@click.option("--type", "job_type", help="Only jobs of this type.")
@click.option("--queue", help="Only jobs in this queue.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--create", is_flag=True, help=CREATE_HELP)
def jobs(status: str | None, job_type: str | None, queue: str | None, limit: int, create: bool) -> None:
    """List recent jobs, newest first. --status pending lists the due ones,
    scheduled the pending jobs whose time is still ahead. The last time
    column is when a waiting job is due, a running one was claimed, or a
    finished one ended."""
    f = job_filter(status, job_type, queue, limit)
    with operator_deck(create=create) as deck:
        now = deck.clock()
        rows = deck.store.list_jobs(f, now)
    if not rows:
        click.echo("no jobs", err=True)
        return
    for line in job_table(rows, now):
        click.echo(line)


def job_id(value: str) -> int:
    """A job id as the API takes it: ASCII digits, from 1 to BIGINT's top."""
    from jobdeck.core.errors import InvalidField
    from jobdeck.core.validation import parse_int

    try:
        return parse_int(value, "ID", 1)
    except InvalidField:
        raise click.BadParameter(f"'{shown(value, 40)}' is not a job id (a whole number from 1)") from None


def _one_id(ctx: click.Context, param: click.Parameter, value: str) -> int:
    return job_id(value)


def _ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(job_id(v) for v in values)


@main.command(short_help="Show one job and its attempts, with their errors.")
@click.argument("job_id", metavar="ID", callback=_one_id)
@click.option("--json", "as_json", is_flag=True, help="The API's JSON for the job (GET /api/jobs/ID).")
@click.option("--tracebacks", is_flag=True, help="Each failed attempt's traceback too.")
@click.option("--logs", "with_logs", is_flag=True, help="Each attempt's log lines (ctx.log) too, up to 1,000.")
def show(job_id: int, as_json: bool, tracebacks: bool, with_logs: bool) -> None:
    """Show one job: its fields, payload and result, and every attempt with
    its outcome and error."""
    from jobdeck.core.errors import JobNotFound
    from jobdeck.jobs.waiting import for_deck
    from jobdeck.store.joblogs import count_lines, lines_of
    from jobdeck.web.serialize import job_json

    with operator_deck() as deck:
        now = deck.clock()
        try:
            job = deck.store.get(job_id)
        except JobNotFound as exc:
            raise click.ClickException(str(exc)) from None
        attempts = deck.store.attempts_of(job_id)
        counted = sum(count_lines(deck.store, job_id).values())
        logs = lines_of(deck.store, job_id) if with_logs and not as_json else []
        reason = for_deck(deck, now).of(job) if as_json else None
    if as_json:  # the fields of GET /api/jobs/ID
        shown_json = job_json(job, now, attempts)
        shown_json["waiting_reason"] = reason
        shown_json["logs"] = {"lines": counted, "url": f"/api/jobs/{job_id}/logs"}
        click.echo(json.dumps(shown_json, indent=2))
        return
    for line in job_page(job, attempts, now, tracebacks):
        click.echo(line)
    if with_logs:
        click.echo(f"log ({counted} lines):" if counted else "log: none")
        for entry in logs:
            click.echo(f"  #{entry.attempt:<3} {when(entry.at)}  {entry.level:<9} {shown(entry.message)}")
    elif counted:
        click.echo(f"log: {counted} lines (--logs shows them)")


def job_page(job: JobRecord, attempts: list[AttemptRecord], now: datetime, tracebacks: bool) -> list[str]:
    """``show``'s text: a field per line, then the attempts, oldest first."""
    from jobdeck.present import priority_text

    fields = [
        ("status", shown_status(job, now) + (f" (due {when(job.available_at)})" if job.status in CLAIMABLE else "")),
        ("type", shown(job.type)), ("queue", shown(job.queue)),
        ("priority", priority_text(job.priority)),
        ("attempts", f"{attempts_text(job)} made / allowed"),
        ("key", shown(job.idempotency_key or "-")),
        *([("unique", shown(job.unique_key) + ("" if job.holds_unique_key(now) else " (released)"))]
          if job.unique_key else []),
        ("created", when(job.created_at)), ("updated", when(job.updated_at)),
        ("claimed", when(job.claimed_at)), ("worker", shown(job.worker_id or "-")),
        ("finished", when(job.finished_at)),
        ("payload", shown(json.dumps(job.payload, ensure_ascii=False))),
    ]  # fmt: skip
    if job.status is State.RUNNING:
        fields.append(("heartbeat", when(job.heartbeat_at)))
    if job.progress is not None or job.progress_message:
        fields.append(("progress", f"{job.progress or 0:.0%} {shown(job.progress_message or '')}".rstrip()))
    if job.result is not None:
        fields.append(("result", shown(json.dumps(job.result, ensure_ascii=False))))
    if job.error:
        fields.append(("error", shown(error_text(job))))
    lines = [f"job {job.id}"] + [f"  {name:<10} {value}" for name, value in fields]
    lines.append(f"attempts ({len(attempts)}):" if attempts else "attempts: none yet")
    for a in attempts:
        took = f"{a.duration:.3f} s" if a.duration is not None else "-"
        lines.append(
            f"  #{a.attempt:<3} {a.outcome.value:<11} {when(a.started_at)}  {took:>10}  {shown(a.worker_id or '-')}"
        )
        if a.error:
            lines.append(f"       {shown(a.error)}")
        if tracebacks and a.traceback:
            lines.extend(f"       {shown(line)}" for line in a.traceback.rstrip("\n").split("\n"))
    return lines


ACTOR = "cli"
"""Who the audit log names for what these commands do."""


@dataclass(frozen=True)
class JobAction:
    """One operator command over jobs: by id (``jobdeck retry 12 13``) and,
    with ``many``, over everything a filter matches (``--all``). The
    commands are built from ``JOB_ACTIONS``, so a new action is one entry."""

    name: str
    past: str
    transition: Transition
    one: Callable[[Jobdeck, int], JobRecord]
    """Move one job and write its audit entry; raises ``TransitionRefused``
    (it moved on) or ``JobNotFound``."""
    many: Callable[[Jobdeck, list[int], datetime, Tally], list[int]] | None = None
    """Move a batch of ids at once, returning those moved (the rest had
    moved on), counted into the bulk action's audit entry (``Tally``) in
    the batch's own transaction. None: ids only."""


def audited(verb: str, move: Callable[[Store, int, datetime], JobRecord]) -> Callable[[Jobdeck, int], JobRecord]:
    """``move`` for one job, audit-logged as the dashboard's buttons are: a
    refusal is written too (count 0, with the reason)."""
    from jobdeck.core.errors import TransitionRefused
    from jobdeck.store.audit import record_action

    def one(deck: Jobdeck, job_id: int) -> JobRecord:
        now = deck.clock()
        try:
            job = move(deck.store, job_id, now)
        except TransitionRefused as exc:
            record_action(deck.store, ACTOR, verb, now, count=0, job_id=job_id, detail=f"refused: {exc}")
            raise
        record_action(deck.store, ACTOR, verb, now, count=1, job_id=job_id)
        return job

    return one


JOB_ACTIONS: tuple[JobAction, ...] = (
    JobAction("retry", "retried", Transition.RETRY, audited("retry", lambda store, job_id, now: store.retry(job_id, now)),
              lambda deck, ids, now, tally: deck.store.retry_ids(ids, now, tally)),
    JobAction("discard", "discarded", Transition.DISCARD,
              audited("discard", lambda store, job_id, now: store.discard(job_id, now)),
              lambda deck, ids, now, tally: deck.store.discard_ids(ids, now, tally)),
    JobAction("cancel", "cancelled", Transition.CANCEL, lambda deck, job_id: deck.cancel(job_id, actor=ACTOR)),
)  # fmt: skip


def act_on_ids(action: JobAction, deck: Jobdeck, job_ids: Iterable[int]) -> int:
    """Each job in turn, one line each; returns how many were refused (it
    moved on, or does not exist: every ``JobdeckError`` names the job)."""
    from jobdeck.core.errors import JobdeckError

    refused = 0
    for job_id in dict.fromkeys(job_ids):
        try:
            job = action.one(deck, job_id)
        except JobdeckError as exc:
            click.echo(f"refused: {exc}", err=True)
            refused += 1
        else:
            click.echo(f"job {job.id} {outcome(action, job)}: now {shown_status(job, deck.clock())}")
    return refused


def outcome(action: JobAction, job: JobRecord) -> str:
    """The past tense ("retried"), unless the job is still running: then the
    action only asked its attempt, which ends it later ("cancel
    requested")."""
    return f"{action.name} requested" if job.status is State.RUNNING else action.past


Move = Callable[["Jobdeck", list[int], datetime, "Tally"], list[int]]


def act_on_matching(action: JobAction, move: Move, deck: Jobdeck, f: JobFilter, what: str, yes: bool) -> int:
    """Every job ``f`` matches in a source state of the action, as the
    dashboard's "all N matching" does it: the jobs up to today's newest id
    (later ones are left alone), in batches of ``BATCH``, one short
    transaction each, newest first, each counting what it moved into the
    action's audit entry in that transaction (``jobdeck.store.audit``), and a
    progress line per batch. Returns how many moved on meanwhile (each is
    named on a line of its own)."""
    from jobdeck.store.audit import Tally, finish_bulk, open_bulk
    from jobdeck.store.reads import BATCH, count_matching, newest_id, next_batch

    store, states = deck.store, SOURCES[action.transition]
    up_to = newest_id(store)
    total = count_matching(store, f, deck.clock(), states, up_to)
    if total == 0:
        click.echo(f"no {what} to {action.name}", err=True)
        return 0
    if not yes:
        click.confirm(f"{action.name.capitalize()} {total} {what}?", abort=True, err=True)
    entry = open_bulk(store, ACTOR, f"{action.name} all", deck.clock(), total=total, detail=f"all {what}")
    done = refused = 0
    below = up_to + 1
    while True:
        batch = next_batch(store, f, deck.clock(), states, below)
        if not batch:
            finish_bulk(store, entry, deck.clock())
            break
        moved = move(deck, batch, deck.clock(), Tally(entry, last=len(batch) < BATCH))
        for job_id in sorted(set(batch) - set(moved), reverse=True):
            click.echo(f"refused: job {job_id} moved on meanwhile; left alone", err=True)
        refused += len(batch) - len(moved)
        done += len(moved)
        click.echo(f"{action.past} {done} of {total}", err=True)
        if len(batch) < BATCH:
            break
        below = min(batch)
    click.echo(f"{done} jobs {action.past}")
    return refused


def described(status: str, job_type: str | None, queue: str | None) -> str:
    """What ``--all`` acts on, in words: "dead jobs of type T in queue Q"."""
    return (
        f"{status} jobs"
        + (f" of type {shown(job_type, 60)}" if job_type else "")
        + (f" in queue {shown(queue, 60)}" if queue else "")
    )


def refuse_filters_with_ids(all_matching: bool, **filters: str | None) -> None:
    """A filter given with ids would be ignored (``retry 2 --type nosuch``
    retried job 2): refused instead, since the operator meant something."""
    given = [f"--{name}" for name, value in filters.items() if value is not None]
    if given and not all_matching:
        raise click.UsageError(f"{given[0]} filters --all only; with job ids, give the ids alone")


def add_job_command(action: JobAction, group: click.Group = main) -> None:
    """``jobdeck <action> ID...``, and ``--all`` when the action has a batch form."""
    sources = SOURCES[action.transition]
    choices = status_names(sources)
    many = action.many

    def run(job_ids: tuple[int, ...], all_matching: bool = False, status: str | None = None,
            job_type: str | None = None, queue: str | None = None, yes: bool = False) -> None:  # fmt: skip
        if all_matching == bool(job_ids):
            raise click.UsageError("give job ids, or --all with --status" if many else "give job ids")
        if all_matching and status is None:
            raise click.UsageError(f"--all needs --status (one of {', '.join(choices)})")
        refuse_filters_with_ids(all_matching, status=status, type=job_type, queue=queue)
        f = job_filter(status, job_type, queue) if all_matching else None
        with operator_deck() as deck:
            if many is not None and f is not None and status is not None:
                refused = act_on_matching(action, many, deck, f, described(status, job_type, queue), yes)
            else:
                refused = act_on_ids(action, deck, job_ids)
        if refused:
            sys.exit(1)

    allowed = " or ".join(s.value for s in ALL_STATES if s in sources)
    run.__doc__ = (
        f"{action.name.capitalize()} jobs by id" + (", or --all jobs matching a status (and type, queue)" if many else "")
        + f". Only {allowed} jobs can be {action.past}: a job that moved on is refused with a line saying so,"
        " and the exit status is 1. Audit-logged as done by 'cli'."
    )  # fmt: skip
    params: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.argument("job_ids", nargs=-1, metavar="[ID]...", callback=_ids)
    ]
    if many is not None:
        params += [
            click.option("--all", "all_matching", is_flag=True, help="Every job matching --status (--type, --queue)."),
            click.option("--status", type=click.Choice(choices), help="With --all: the jobs in this state."),
            click.option("--type", "job_type", help="With --all: only jobs of this type."),
            click.option("--queue", help="With --all: only jobs in this queue."),
            click.option("--yes", "-y", is_flag=True, help="With --all: do not ask to confirm."),
        ]
    command: Callable[..., None] = run
    for param in reversed(params):
        command = param(command)
    short = f"{action.name.capitalize()} jobs by id" + (", or --all matching a filter." if many else ".")
    group.command(action.name, short_help=short)(command)


for _action in JOB_ACTIONS:
    add_job_command(_action)


@main.command("hash-password", short_help="Print a password hash for a dashboard user.")
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


@main.command("init-db", short_help="Create the database schema (or bring it up to date).")
def init_db() -> None:
    """Create the database schema."""
    config = _config(False)
    _app(config)
    click.echo(f"database ready: {masked(config.resolved_database_url())}")


@main.group(short_help="Database schema migrations: upgrade, downgrade, current.")
def db() -> None:
    """Database schema migrations (Alembic; revisions in app/store/migrations)."""


@contextmanager
def _engine() -> Iterator[Any]:
    from jobdeck.store.engine import make_engine

    config = _config(False)
    engine = make_engine(config.resolved_database_url(), synchronous=config.sqlite_synchronous, pool_size=2)
    try:
        yield engine
    finally:
        engine.dispose()


@db.command("upgrade", short_help="Upgrade the schema (to head by default).")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Upgrade the schema (to head by default). Safe while Jobdeck runs, and
    from several hosts at once: one migrates, the others wait and find it done."""
    from jobdeck.store import migrate

    with _engine() as engine:
        before = migrate.current(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current(engine)
    click.echo(f"schema at {', '.join(sorted(after))} (was {', '.join(sorted(before)) or 'unversioned'})")


@db.command("downgrade", short_help="Downgrade the schema to REVISION (e.g. 0001, or -1).")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Downgrade the schema to REVISION (e.g. 0001, or -1)."""
    from jobdeck.store import migrate

    with _engine() as engine:
        migrate.downgrade(engine, revision)
        click.echo(f"schema at {', '.join(sorted(migrate.current(engine))) or 'base'}")


@db.command("current", short_help="Show the database's schema revision and the code's.")
def db_current() -> None:
    """Show the schema revision of the database and the code's head."""
    from jobdeck.store import migrate

    with _engine() as engine:
        have = migrate.current(engine)
    click.echo(f"database: {', '.join(sorted(have)) or 'unversioned'}; code: {', '.join(sorted(migrate.heads()))}")
    if have != migrate.heads():
        sys.exit(1)


@db.command("revision", short_help="[developer] Write a new migration from models.py.")
@click.option("-m", "--message", required=True, help="What the revision changes.")
@click.option("--empty", is_flag=True, help="An empty revision instead of autogenerating from the models.")
def db_revision(message: str, empty: bool) -> None:
    """For Jobdeck's developers, in a source checkout: write a new revision
    into app/store/migrations/versions, autogenerated from the difference
    between app/store/models.py and the database at head. Point
    JOBDECK_DATABASE_URL at a scratch database (a fresh SQLite file will do)."""
    from jobdeck.store import migrate

    with _engine() as engine:
        try:
            path = migrate.revision(engine, message, autogenerate=not empty)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {path}; review it (ALTERs on SQLite go through batch_alter_table) and commit it")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
