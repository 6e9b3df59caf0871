"""Named API tokens: ``token create``."""

from __future__ import annotations

from collections.abc import Iterable

import click
from jobdeck.cli.base import main


@main.group("token", short_help="Make named API tokens with least privilege.")
def token() -> None:
    """Named API tokens: the config keeps each one's hash and scopes ([api_tokens.NAME])."""


@token.command("create", short_help="Print a new token once, and the config lines that admit it.")
@click.argument("name")
@click.option(
    "--scopes", multiple=True, required=True, help="enqueue, work, read or operate; comma-separated or repeated."
)
@click.option("--types", multiple=True, help="Work only these job types (a work token); comma-separated or repeated.")
@click.option("--queues", multiple=True, help="Work only these queues (a work token); comma-separated or repeated.")
def create(name: str, scopes: tuple[str, ...], types: tuple[str, ...], queues: tuple[str, ...]) -> None:
    """Make a token NAME: print it once (Jobdeck keeps only its SHA-256) and
    the [api_tokens.NAME] table to add to jobdeck.toml."""
    from jobdeck.core.config import ConfigError
    from jobdeck.web.tokens import check_new, config_lines, new_token

    scope_list, type_list, queue_list = _split(scopes), _split(types), _split(queues)
    try:
        check_new(name, scope_list, type_list, queue_list)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    secret = new_token()
    click.echo(f"Token for {name} (shown this once; Jobdeck keeps only its hash):\n\n    {secret}\n")
    click.echo("Add to jobdeck.toml, then restart Jobdeck:\n")
    click.echo(config_lines(name, secret, scope_list, type_list, queue_list))


def _split(values: Iterable[str]) -> list[str]:
    """``--scopes work,read --scopes enqueue`` as ``[work, read, enqueue]``, each once."""
    return list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))
