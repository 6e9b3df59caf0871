"""Jobdeck: a background job queue with an operator dashboard.

The public API is what this module exports, and only that (``docs/python.md``
lists it; a test holds the page to ``__all__``)::

    from jobdeck import Jobdeck, handler

Every name is loaded on first use: a process that only works jobs
(``jobdeck worker``) never imports Flask, and ``import jobdeck`` costs nothing.
``create_app`` builds the Flask app and starts nothing; ``Runtime`` (or
``Jobdeck.start``) starts the worker pool and the scheduler, once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobdeck.core.lazy import lazy_names

if TYPE_CHECKING:
    from jobdeck.core.errors import Cancelled, DeadLetter, EffectNotPerformed, InvalidField
    from jobdeck.deck import Jobdeck
    from jobdeck.jobs.async_context import AsyncJobContext
    from jobdeck.jobs.context import JobContext
    from jobdeck.jobs.handlers import Registry, handler
    from jobdeck.jobs.handles import Handle, NoDeck, use_deck
    from jobdeck.jobs.snooze import Snooze
    from jobdeck.runtime import Runtime
    from jobdeck.web.factory import create_app, deck_of

__all__ = [
    "AsyncJobContext", "Cancelled", "DeadLetter", "EffectNotPerformed", "Handle", "InvalidField", "JobContext", "Jobdeck",
    "NoDeck", "Registry", "Runtime", "Snooze", "create_app", "deck_of", "handler", "use_deck",
]  # fmt: skip

_HOMES = {
    "Jobdeck": "jobdeck.deck",
    "Runtime": "jobdeck.runtime",
    "create_app": "jobdeck.web.factory",
    "deck_of": "jobdeck.web.factory",
    "handler": "jobdeck.jobs.handlers",
    "Registry": "jobdeck.jobs.handlers",
    "Handle": "jobdeck.jobs.handles",
    "NoDeck": "jobdeck.jobs.handles",
    "use_deck": "jobdeck.jobs.handles",
    "JobContext": "jobdeck.jobs.context",
    "AsyncJobContext": "jobdeck.jobs.async_context",
    "Snooze": "jobdeck.jobs.snooze",
    "Cancelled": "jobdeck.core.errors",
    "DeadLetter": "jobdeck.core.errors",
    "EffectNotPerformed": "jobdeck.core.errors",
    "InvalidField": "jobdeck.core.errors",
}


__getattr__ = lazy_names(__name__, _HOMES)
