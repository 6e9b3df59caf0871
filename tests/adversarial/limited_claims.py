"""What the hostile tests of the concurrency-limited claim share
(``test_limited_claim_hostile``, ``_races`` and ``_killed``)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import pytest
from jobdeck.core.states import AttemptOutcome
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.store import JobRecord, Outcome, controls

POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgres"], indirect=True)
SLEEP = {"seconds": 60}
TYPES = ["demo.sleep", "demo.noop", "demo.report"]


def policy(deck: Jobdeck, types: dict[str, int] | None = None, queues: dict[str, int] | None = None) -> QueueControls:
    controls_ = QueueControls(deck.store, Limits(queues=queues or {}, types=types or {}), refresh=0)
    controls_.install()
    return controls_


def done(job: JobRecord, worker: str = "w1") -> Outcome:
    return Outcome(job.id, worker, attempt=job.attempt, started_at=job.claimed_at)


def ids(claimed: Iterable[JobRecord]) -> list[int]:
    return [j.id for j in claimed]


def completed_attempts(deck: Jobdeck, job_id: int) -> int:
    return sum(a.outcome == AttemptOutcome.COMPLETED for a in deck.store.attempts_of(job_id))


class Paths:
    """Counts PostgreSQL's pipelined tries and the picked claims (its
    fallback, and SQLite's path): a run that never kept a try, or never
    fell back, did not attack what it is meant to."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tries = self.picked = 0
        lock = threading.Lock()
        pipelined, picked = controls._Claim.pipelined, controls._Claim.picked

        def counting_pipelined(*args: Any, **kwargs: Any) -> Any:
            with lock:
                self.tries += 1
            return pipelined(*args, **kwargs)

        def counting_picked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                self.picked += 1
            return picked(*args, **kwargs)

        monkeypatch.setattr(controls._Claim, "pipelined", counting_pipelined)
        monkeypatch.setattr(controls._Claim, "picked", counting_picked)

    def check(self, backend: str) -> str:
        if backend == "postgres":
            assert self.tries > self.picked > 0, f"tries {self.tries}, fallbacks {self.picked}: a path never ran"
        return f"pipelined tries {self.tries}, picked claims {self.picked}"


def schema_name(deck: Jobdeck) -> str:
    """The application_name every connection of this test's PostgreSQL schema carries (``tests.pgtest``)."""
    name = deck.store.engine.url.query.get("application_name")
    assert isinstance(name, str) and name, "the PostgreSQL test URL names its schema as application_name"
    return name
