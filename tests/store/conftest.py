"""The driver suite (River's ``riverdrivertest``, for Jobdeck's store):
every test here runs on a real SQLite file and on PostgreSQL (each module
sets ``pytestmark = pytest.mark.backends``), and on the batched, single and
HTTP paths of each transition (``tests/store/driver.py``).

``python tests/store/drift.py`` breaks one guard at a time in a copy of the
tree and shows which test here catches it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from jobdeck.deck import Jobdeck

from tests.store.driver import Driver


@pytest.fixture
def drv(deck: Jobdeck, clock: Any, make_deck: Callable[..., Jobdeck]) -> Driver:
    return Driver(deck=deck, clock=clock, make_deck=make_deck)
