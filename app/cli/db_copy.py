"""``jobdeck db copy``: move a stopped deployment with its data to another
database (``jobdeck.store.transfer``), typically from SQLite to PostgreSQL."""

from __future__ import annotations

import sys
import time

import click
from jobdeck.cli.base import masked
from jobdeck.cli.schema import db

PROGRESS_EVERY = 10.0
"""Seconds after which a table that is still on the same tenth of its rows says where it is."""


class Progress:
    """Progress lines on stderr: a table's first line, one each time it
    passes another tenth of its rows, and one every ``PROGRESS_EVERY``
    seconds in between; so a table of any size prints a dozen lines or so,
    and a long one still shows it moves. Empty tables say nothing here; the
    report at the end names every table."""

    def __init__(self) -> None:
        self._shown: dict[tuple[str, str], tuple[int, float]] = {}

    def __call__(self, step: str, table: str, done: int, total: int) -> None:
        if total == 0:
            return
        tenth, now = done * 10 // total, time.monotonic()
        shown = self._shown.get((step, table))
        if shown is not None and shown[0] == tenth and now - shown[1] < PROGRESS_EVERY:
            return
        self._shown[(step, table)] = (tenth, now)
        click.echo(f"{step} {table}: {done} of {total} rows", err=True)


@db.command("copy", short_help="Copy a stopped deployment with its data to another database.")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="URL",
    help="The deployment's database, stopped (e.g. sqlite:///instance/jobdeck.db).",
)
@click.option(
    "--to",
    "target",
    required=True,
    metavar="URL",
    help="The database to copy into: empty, or holding an interrupted copy of the same source.",
)
@click.option("--batch-size", default=1000, show_default=True, type=click.IntRange(min=1), help="Rows per transaction.")
@click.option(
    "--stale-after",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds after which a worker pool's last heartbeat no longer counts as a running process.",
)
def db_copy(source: str, target: str, batch_size: int, stale_after: float) -> None:
    """Copy every table of a stopped deployment (jobs in every state with
    their attempts, logs, effects and artifacts, workflows, batches,
    schedules' state, queue controls, flow limits, sessions, the audit log)
    into another database, keeping ids. The target is migrated to this
    version's schema first. Refused while a process has the source open, or
    when the target holds other data. Cut short, it goes on where it
    stopped when run again. Exit status 1 when the counts differ at the end."""
    from jobdeck.store.transfer import CopyError, copy_database, report
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        click.echo(f"copying {masked(source)} to {masked(target)}", err=True)
        counts = copy_database(source, target, batch_size=batch_size, progress=Progress(), stale_after=stale_after)
    except CopyError as exc:
        raise click.ClickException(str(exc)) from None
    except ArgumentError as exc:
        raise click.ClickException(f"not a database URL: {exc}") from None
    except DBAPIError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise click.ClickException(f"the copy stopped: {reason}; run it again once the cause is fixed") from None
    for line in report(counts):
        click.echo(line)
    if not all(c.matches for c in counts):
        sys.exit(1)
