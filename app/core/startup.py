"""A Jobdeck process's start-up: its imports (SQLAlchemy, the tables,
click, a child's handler modules) make most of the objects it will
ever hold, and they live as long as it does. The cyclic collector walked
them again and again as they piled up, and every full collection after
start-up walked them all again. A process that Jobdeck starts itself (the
``jobdeck`` program, a process executor's child) collects nothing while it
imports, then moves what it imported out of the collector's sight for good
(``gc.freeze``): its start-up takes about a quarter less CPU
(docs/performance.md), and its loops' collections walk only what they made.
The few cycles the imports left stay, once. A process that merely imports
Jobdeck (a test's CLI runner, an embedding host) is left as it is."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_imports(starting: bool) -> Iterator[None]:
    """Around a starting process's imports: no collection inside the block,
    then everything it made frozen. Nothing changes when ``starting`` is
    false or the collector is already off (an outer block has it)."""
    if not starting or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
