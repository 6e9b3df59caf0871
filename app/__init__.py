"""Jobdeck: a background job queue with an operator dashboard.

``create_app`` (``app.web.factory``) builds the Flask app and starts nothing;
``app.runtime.Runtime`` starts the worker pool and the scheduler, once per
process. Both names, and ``Jobdeck``, are loaded on first use: a process
that only works jobs (``jobdeck worker``) never imports Flask.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.deck import Jobdeck
    from app.web.factory import create_app, deck_of

__all__ = ["Jobdeck", "create_app", "deck_of"]

_HOMES = {"Jobdeck": "app.deck", "create_app": "app.web.factory", "deck_of": "app.web.factory"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'app' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
