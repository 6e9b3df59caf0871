"""The ``jobdeck`` command: serve, worker, enqueue, jobs, show, retry,
discard, cancel, hash-password, token, init-db, db.

One module per area registers its commands on ``main`` (``base.py``):
``serving`` (serve, worker), ``job_commands`` (enqueue, jobs, show),
``job_actions`` (retry, discard, cancel), ``schema`` (init-db, db),
``db_copy`` (db copy), ``passwords`` (hash-password) and ``tokens`` (token
create). Importing this package registers them all; the console script and
``python -m jobdeck.cli`` both run ``main``."""

from __future__ import annotations

from jobdeck.cli.base import _starts_the_program
from jobdeck.core.startup import frozen_imports

with frozen_imports(_starts_the_program()):
    from jobdeck.cli import db_copy, job_actions, job_commands, passwords, schema, serving, tokens
    from jobdeck.cli.base import main, masked, missing_sqlite_file, operator_deck
    from jobdeck.cli.job_actions import JOB_ACTIONS, JobAction, act_on_matching, add_job_command, audited
    from jobdeck.cli.job_commands import job_filter
    from jobdeck.cli.serving import OneLineFormatter, refuse_exposed

__all__ = [
    "JOB_ACTIONS",
    "JobAction",
    "OneLineFormatter",
    "act_on_matching",
    "add_job_command",
    "audited",
    "db_copy",
    "job_actions",
    "job_commands",
    "job_filter",
    "main",
    "masked",
    "missing_sqlite_file",
    "operator_deck",
    "passwords",
    "refuse_exposed",
    "schema",
    "serving",
    "tokens",
]
