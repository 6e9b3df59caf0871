"""The operator's commands that move jobs: retry, discard, cancel, by id
or ``--all`` matching a filter, audit-logged as done by ``cli``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import click
from jobdeck.cli.base import main, operator_deck, shown
from jobdeck.cli.job_commands import job_filter, job_ids_argument
from jobdeck.cli.text import shown_status, status_names
from jobdeck.core.states import ALL_STATES, SOURCES, State, Transition

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck
    from jobdeck.store import JobFilter, JobRecord, Store


ACTOR = "cli"
"""Who the audit log names for what these commands do."""


@dataclass(frozen=True)
class JobAction:
    """One operator command over jobs: by id (``jobdeck retry 12 13``) and,
    with ``matching``, over everything a filter matches (``--all``). The
    commands are built from ``JOB_ACTIONS``, so a new action is one entry."""

    name: str
    past: str
    transition: Transition
    one: Callable[[Jobdeck, int], JobRecord]
    """Move one job and write its audit entry; raises ``TransitionRefused``
    (it moved on) or ``JobNotFound``."""
    matching: bool = False
    """Whether it also moves everything a filter matches (``--all``), by
    ``jobdeck.actions.move_matching`` as the dashboard's "all N matching" does."""


def audited(verb: str, move: Callable[[Store, int, datetime], JobRecord]) -> Callable[[Jobdeck, int], JobRecord]:
    """``move`` for one job, audit-logged as every front end's actions are
    (``jobdeck.actions.audited``): a refusal is written too (count 0, with the reason)."""

    def one(deck: Jobdeck, job_id: int) -> JobRecord:
        from jobdeck import actions

        now = deck.clock()
        return actions.audited(deck.store, ACTOR, verb, job_id, now, lambda: move(deck.store, job_id, now))

    return one


def shared(name: str) -> Callable[[Jobdeck, int], JobRecord]:
    """``jobdeck.actions``' job action ``name``, done as ``cli``. Looked up
    when a command runs: the actions load the store and SQLAlchemy, which
    ``jobdeck --help``, ``hash-password`` and ``token create`` never need."""

    def one(deck: Jobdeck, job_id: int) -> JobRecord:
        from jobdeck import actions

        act: Callable[[Store, int, str, datetime], JobRecord] = getattr(actions, name)
        return act(deck.store, job_id, ACTOR, deck.clock())

    return one


JOB_ACTIONS: tuple[JobAction, ...] = (
    JobAction("retry", "retried", Transition.RETRY, shared("retry"), matching=True),
    JobAction("discard", "discarded", Transition.DISCARD, shared("discard"), matching=True),
    JobAction("cancel", "cancelled", Transition.CANCEL, shared("cancel")),
)


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


def act_on_matching(action: JobAction, deck: Jobdeck, f: JobFilter, what: str, yes: bool) -> int:
    """Every job ``f`` matches in a source state of the action, as the
    dashboard's "all N matching" does it (``jobdeck.actions.move_matching``):
    the jobs up to today's newest id (later ones are left alone), in batches
    of ``BATCH``, one short transaction each, newest first, each counting
    what it moved into the action's audit entry in that transaction, and a
    progress line per batch. Returns how many moved on meanwhile (each is
    named on a line of its own)."""
    from jobdeck import actions
    from jobdeck.store.reads import count_matching, newest_id

    store, states = deck.store, SOURCES[action.transition]
    up_to = newest_id(store)
    total = count_matching(store, f, deck.clock(), states, up_to)
    if total == 0:
        click.echo(f"no {what} to {action.name}", err=True)
        return 0
    if not yes:
        click.confirm(f"{action.name.capitalize()} {total} {what}?", abort=True, err=True)
    entry = actions.open_matching(store, action.transition, ACTOR, deck.clock(), total=total, detail=f"all {what}")
    done = refused = 0
    below = up_to + 1
    while True:
        step = actions.move_matching(store, action.transition, f, entry, below, deck.clock())
        if not step.ids:
            break
        for job_id in step.moved_on:
            click.echo(f"refused: job {job_id} moved on meanwhile; left alone", err=True)
        refused += len(step.moved_on)
        done += len(step.moved)
        click.echo(f"{action.past} {done} of {total}", err=True)
        if step.finished:
            break
        below = step.below
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
    matching = action.matching

    def run(job_ids: tuple[int, ...], all_matching: bool = False, status: str | None = None,
            job_type: str | None = None, queue: str | None = None, yes: bool = False) -> None:  # fmt: skip
        if all_matching == bool(job_ids):
            raise click.UsageError("give job ids, or --all with --status" if matching else "give job ids")
        if all_matching and status is None:
            raise click.UsageError(f"--all needs --status (one of {', '.join(choices)})")
        refuse_filters_with_ids(all_matching, status=status, type=job_type, queue=queue)
        f = job_filter(status, job_type, queue) if all_matching else None
        with operator_deck() as deck:
            if matching and f is not None and status is not None:
                refused = act_on_matching(action, deck, f, described(status, job_type, queue), yes)
            else:
                refused = act_on_ids(action, deck, job_ids)
        if refused:
            sys.exit(1)

    allowed = " or ".join(s.value for s in ALL_STATES if s in sources)
    run.__doc__ = (
        f"{action.name.capitalize()} jobs by id" + (", or --all jobs matching a status (and type, queue)" if matching else "")
        + f". Only {allowed} jobs can be {action.past}: a job that moved on is refused with a line saying so,"
        " and the exit status is 1. Audit-logged as done by 'cli'."
    )  # fmt: skip
    params: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.argument("job_ids", nargs=-1, metavar="[ID]...", callback=job_ids_argument)
    ]
    if matching:
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
    short = f"{action.name.capitalize()} jobs by id" + (", or --all matching a filter." if matching else ".")
    group.command(action.name, short_help=short)(command)


for _action in JOB_ACTIONS:
    add_job_command(_action)
