"""Dashboard users' password hashes: ``hash-password``."""

from __future__ import annotations

import sys

import click
from jobdeck.cli.base import main


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
