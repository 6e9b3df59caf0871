"""What the store keeps of a unique job (``jobdeck.jobs.unique`` holds the rules):
the claim an enqueue stores, and how a job's unique states are stored as a
bit mask. Here so that the store, which frees and takes keys, needs nothing
from the layer above it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobdeck.core.states import SCHEDULED, State

STATE_BITS: dict[str, int] = {
    State.PENDING.value: 1,
    SCHEDULED: 2,
    State.RUNNING.value: 4,
    State.FAILED.value: 8,
    State.DEAD.value: 16,
    State.COMPLETED.value: 32,
    State.DISCARDED.value: 64,
    State.CANCELLED.value: 128,
}
"""How a job's unique states are stored (``jobs.unique_states``, a bit mask).
Fixed numbers, not positions in ``State``: a state added later must not
change what stored masks mean (until it has a bit, no job holds its key in it)."""


@dataclass(frozen=True)
class UniqueClaim:
    """What an enqueue stores and does for its unique option (``NewJob.unique``)."""

    key: str
    until: datetime | None
    states: int
    replace: bool
    debounce: float | None
