"""What every command shares: the configuration, the deck of an operator
command and the database it names, the ``main`` group, and user text made
safe for a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from jobdeck.core.config import Config, ConfigError, load
from jobdeck.core.startup import frozen_imports

if TYPE_CHECKING:
    from jobdeck.deck import Jobdeck


def command_config(demo: bool, **overrides: Any) -> Config:
    values = {k: v for k, v in overrides.items() if v is not None}
    if demo:
        values["demo"] = True
    try:
        return load(overrides=values)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def command_app(config: Config):  # type: ignore[no-untyped-def]
    from jobdeck import create_app

    try:
        return create_app(config)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def command_deck(config: Config) -> Jobdeck:
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
    from sqlalchemy.exc import ArgumentError

    config = command_config(demo)
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
    deck = command_deck(config)  # no Flask app: the command serves nothing (its web modules cost a start-up)
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


def _starts_the_program() -> bool:
    """This import starts the ``jobdeck`` program: the console script, or
    ``python -m jobdeck.cli`` (whose package is imported while
    ``sys.argv[0]`` is still ``-m``), not a process that imports the
    commands to use them (a test's CLI runner, an embedding host, which
    may have no ``sys.argv`` at all)."""
    argv = getattr(sys, "argv", None) or [""]
    return argv[0] == "-m" or Path(argv[0]).stem == "jobdeck"


_STARTING = _starts_the_program()
"""Taken as the package is imported: by the time a command runs,
``python -m jobdeck.cli`` has set ``sys.argv[0]`` to its ``__main__.py``."""

WITHOUT_DATABASE = frozenset({"hash-password", "token"})
"""Commands that never open a database, so start without the deck, the
store and SQLAlchemy, as ``jobdeck --help`` does."""


@click.group()
@click.pass_context
def main(ctx: click.Context) -> None:
    """Jobdeck: a background job queue with an operator dashboard."""
    if ctx.invoked_subcommand not in WITHOUT_DATABASE:
        # Most of a command's start-up: loaded as the program's own imports
        # are, collecting nothing and frozen after (jobdeck.core.startup).
        with frozen_imports(_STARTING):
            import_module("jobdeck.deck")


def escape_controls(text: str) -> str:
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


def shown(text: str, most: int | None = None) -> str:
    """User data (types, errors, payloads) made safe for a terminal: control
    characters escaped (an ESC sequence in an error message would otherwise
    drive the operator's terminal), cut to ``most`` characters."""
    text = escape_controls(text)
    return text if most is None or len(text) <= most else text[: most - 1] + "…"
