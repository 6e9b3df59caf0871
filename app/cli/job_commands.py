"""The operator's commands that add and read jobs: enqueue, jobs, show."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, BinaryIO

import click
from jobdeck.cli.base import CREATE_HELP, main, operator_deck, shown
from jobdeck.cli.text import SCHEDULED, job_page, job_table, status_names, when
from jobdeck.core.states import State
from jobdeck.core.validation import max_body_bytes

if TYPE_CHECKING:
    from jobdeck.store import JobFilter


@main.command(short_help="Enqueue a job, or the jobs of a JSON Lines file, and print them as JSON.")
@click.argument("job_type", required=False)
@click.option("--payload", help="The payload as a JSON object.")
@click.option("--priority", help="An integer or low|medium|high|critical.")
@click.option("--delay", type=float, help="Seconds from now.")
@click.option("--key", help="Idempotency key.")
@click.option("--queue", help="Queue name.")
@click.option("--max-retries", type=int)
@click.option(
    "--file",
    "jobs_file",
    type=click.File("rb"),
    help="Enqueue the jobs of this file instead, one JSON object a line with the fields of POST /api/jobs "
    "(- for stdin): all of them in one transaction, or none.",
)
@click.option("--demo", is_flag=True, help="Accept the demo job types.")
@click.option("--create", is_flag=True, help=CREATE_HELP)
def enqueue(job_type: str | None, payload: str | None, priority: str | None, delay: float | None, key: str | None,
            queue: str | None, max_retries: int | None, jobs_file: BinaryIO | None, demo: bool,
            create: bool) -> None:  # fmt: skip
    """Enqueue a job and print it as JSON. With --file, enqueue every job of
    a JSON Lines file as POST /api/jobs/bulk does: each checked as one, all
    in one transaction or none (an error names the line), and print one
    line per job: its id, whether it was created, whether it is a duplicate."""
    from jobdeck.core.errors import InvalidField, JobdeckError, UnknownType
    from jobdeck.core.validation import loads
    from jobdeck.web.serialize import job_json

    if jobs_file is not None:
        single = {"TYPE": job_type, "--payload": payload, "--priority": priority, "--delay": delay, "--key": key,
                  "--queue": queue, "--max-retries": max_retries}  # fmt: skip
        given = [name for name, value in single.items() if value is not None]
        if given:
            raise click.UsageError(f"--file takes every field from its lines; leave out {', '.join(given)}")
        _enqueue_file(jobs_file, demo, create)
        return
    if job_type is None:
        raise click.UsageError("give a job TYPE, or --file with the jobs")
    try:
        data = loads(payload or "{}", "payload")
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
            raise click.ClickException(_unknown_type(str(exc), job_type, deck.config.demo)) from None
        except JobdeckError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(json.dumps(job_json(job, deck.clock()), indent=2))
    if enqueued.duplicate:
        click.echo(f"a duplicate: job {job.id} holds the unique key {job.unique_key}; this is that job", err=True)
    elif not created:
        click.echo(f"idempotency key {key!r} already existed: this is the existing job", err=True)


def _unknown_type(message: str, job_type: Any, demo: bool) -> str:
    needs_demo = isinstance(job_type, str) and job_type.startswith("demo.") and not demo
    return f"{message} (the demo types need --demo)" if needs_demo else message


def _enqueue_file(jobs_file: BinaryIO, demo: bool, create: bool) -> None:
    """``enqueue --file``: read the lines (``read_jobs``), then enqueue them
    all through ``Jobdeck.enqueue_bulk``, the bulk API's way."""
    from jobdeck.core.errors import InvalidField, ItemRefused, JobdeckError, UnknownType

    with operator_deck(demo=demo, create=create) as deck:
        items, lines = read_jobs(jobs_file, deck.config.max_bulk_jobs, max_body_bytes(deck.config.max_payload_bytes))
        if not items:
            raise click.ClickException("no jobs in the file: give one JSON object a line")
        try:
            enqueued = deck.enqueue_bulk(items)
        except ItemRefused as exc:
            where = f"line {lines[exc.index]}: " + (f"{exc.inner_field}: " if exc.inner_field else "")
            reason = exc.reason
            if isinstance(exc.refused, UnknownType):
                reason = _unknown_type(exc.reason, items[exc.index].get("type"), deck.config.demo)
            raise click.ClickException(f"{where}{reason}; nothing was enqueued") from None
        except (InvalidField, JobdeckError) as exc:
            raise click.ClickException(f"{exc}; nothing was enqueued") from None
    for e in enqueued:
        click.echo(json.dumps(e._asdict()))
    there = sum(not e.created for e in enqueued)
    already = f"; {there} already there (by key or unique key)" if there else ""
    click.echo(f"enqueued {len(enqueued) - there} of {len(enqueued)} jobs{already}", err=True)


def read_jobs(stream: BinaryIO, most: int, line_bytes: int) -> tuple[list[Any], list[int]]:
    """The jobs of a JSON Lines stream and the line number of each (blank
    lines are skipped). Each line is parsed as ``POST /api/jobs`` parses its
    body, and is at most that body's cap (``line_bytes``); more than
    ``most`` jobs stop the reading: both bound what a stream makes this read."""
    from jobdeck.core.errors import InvalidField
    from jobdeck.core.validation import loads

    items: list[Any] = []
    lines: list[int] = []
    number = 0
    while chunk := stream.readline(line_bytes + 3):
        number += 1
        text = chunk.rstrip(b"\r\n")
        if len(text) > line_bytes:
            raise click.ClickException(
                f"line {number}: longer than {line_bytes} bytes, the cap of one job's JSON "
                "(three times max_payload_bytes plus 64 KiB); nothing was enqueued"
            )
        if not text.strip():
            continue
        if len(items) == most:
            raise click.ClickException(
                f"line {number}: more than {most} jobs in the file (max_bulk_jobs): split it; nothing was enqueued"
            )
        try:
            items.append(loads(text))
        except InvalidField as exc:
            raise click.ClickException(f"line {number}: {exc}; nothing was enqueued") from None
        except ValueError as exc:
            raise click.ClickException(f"line {number}: not valid JSON ({exc}); nothing was enqueued") from None
        lines.append(number)
    return items, lines


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


def job_id_argument(ctx: click.Context, param: click.Parameter, value: str) -> int:
    return job_id(value)


def job_ids_argument(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(job_id(v) for v in values)


@main.command(short_help="Show one job and its attempts, with their errors.")
@click.argument("job_id", metavar="ID", callback=job_id_argument)
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
