"""Each transition's guard, table-driven from ``jobdeck.core.states.SOURCES``: a job
in every state the transition does not start from is refused on every path
of it (batched, single, HTTP) and left exactly as it was. A new state or a
new transition is covered (or fails by name) without editing this file."""

from __future__ import annotations

from datetime import datetime

import pytest
from jobdeck.core.states import ALL_STATES, SOURCES, Transition
from jobdeck.store import JobRecord

from tests.store.driver import PATHS, Driver

pytestmark = pytest.mark.backends

CASES = [(t, name) for t in Transition for name in PATHS.get(t, {})]


def test_every_transition_has_a_path() -> None:
    assert set(PATHS) == set(Transition), "add the new transition's paths to tests/store/driver.py PATHS"


@pytest.mark.parametrize(("transition", "path"), CASES, ids=[f"{t.value}-{p}" for t, p in CASES])
def test_a_transition_refuses_every_state_outside_its_sources(drv: Driver, transition: Transition, path: str) -> None:
    apply = PATHS[transition][path]
    refused_from = [s for s in ALL_STATES if s not in SOURCES[transition]]
    assert refused_from, f"{transition.value} starts from every state: nothing to refuse"
    for state in refused_from:
        job = drv.in_state(state)
        before = drv.snapshot(job.id)
        worker = job.worker_id or f"w{job.id}"
        applied = apply(drv, job, worker, job.attempt, drv.now)
        assert not applied, f"{path}: {transition.value} applied to a {state.value} job"
        assert drv.snapshot(job.id) == before, f"{path}: a refused {transition.value} changed a {state.value} job"


@pytest.mark.parametrize(("transition", "path"), CASES, ids=[f"{t.value}-{p}" for t, p in CASES])
def test_a_transition_applies_from_each_of_its_sources(drv: Driver, transition: Transition, path: str) -> None:
    """The other half: a path that refused everything would pass the guard test."""
    for state in sorted(SOURCES[transition], key=ALL_STATES.index):
        job = drv.in_state(state)
        before = drv.snapshot(job.id)
        worker = job.worker_id or f"w{job.id}"
        now = drv.clock.advance(1)
        if transition is Transition.CLAIM:
            now = max(now, job.available_at)  # failed waits out its backoff
        assert apply_path(drv, transition, path, job, worker, now), f"{path}: {transition.value} refused {state.value}"
        assert drv.snapshot(job.id) != before


def apply_path(drv: Driver, transition: Transition, path: str, job: JobRecord, worker: str, now: datetime) -> bool:
    return PATHS[transition][path](drv, job, worker, job.attempt, now)
