"""The flow claim under random operations, on both databases: enqueues of
keyed jobs, claims of any size, completions and time passing, checked
after every step against what the limits allow. A concurrency of one per
key is never exceeded, no rate window (type-wide or per key) ever holds
more starts than its count, no job is claimed twice, and a pending job is
always claimable once nothing runs and every window has passed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from jobdeck.deck import Jobdeck
from jobdeck.store import Outcome
from jobdeck.store.models import attempts, flow_closed, flow_starts, jobs
from sqlalchemy import delete

from tests.conftest import Clock

pytestmark = pytest.mark.backends

KEYED = "demo.noop"
"""One running job per ``payload.k``, and 3 starts per 10 s for the whole type."""
RATED = "demo.sleep"
"""2 starts per 5 s for each ``payload.a`` (a missing account is one bucket)."""
LIMITS = {
    KEYED: {"concurrency": 1, "concurrency_key": "payload.k", "rate": "3/10s"},
    RATED: {"rate": "2/5s", "rate_key": "payload.a"},
}
WINDOWS = {KEYED: (10.0, 3), RATED: (5.0, 2)}
KEYS = st.sampled_from(["a", 'b "q" \\ {,}', "NULL", None])
"""Keys that are awkward in an array literal (quotes, a backslash, braces, a
comma; the word NULL, not the null key), which PostgreSQL's flow claim
sends its starts' keys in (``claim_statements.claim_ids_logging``)."""


class FlowMachine(RuleBasedStateMachine):
    def __init__(self, deck: Jobdeck, clock: Clock) -> None:
        super().__init__()
        self.deck, self.store, self.clock = deck, deck.store, clock
        self.pending: dict[int, tuple[str, str | None]] = {}
        """Job id -> (type, its bucket: payload.k for KEYED, payload.a for RATED)."""
        self.running: dict[int, tuple[str, str | None, int]] = {}
        """Job id -> (type, bucket, attempt)."""
        self.starts: list[tuple[datetime, str, str | None]] = []

    @initialize()
    def empty_database(self) -> None:
        with self.store.write() as conn:
            for table in (attempts, flow_starts, flow_closed, jobs):
                conn.execute(delete(table))
        self.clock.now = datetime(2030, 1, 1, tzinfo=self.clock.now.tzinfo)

    @rule(kind=st.sampled_from([KEYED, RATED]), key=KEYS, n=st.integers(1, 4))
    def enqueue(self, kind: str, key: str | None, n: int) -> None:
        field = "k" if kind == KEYED else "a"
        payload = {} if key is None else {field: key}
        for job_id in self.deck.enqueue_many([{"type": kind, "payload": payload}] * n):
            self.pending[job_id] = (kind, key)

    @rule(limit=st.integers(1, 6))
    def claim(self, limit: int) -> None:
        now = self.clock.now
        claimed = self.store.claim("w", now, limit=limit, types=[KEYED, RATED])
        assert len(claimed) <= limit
        for job in claimed:
            assert job.id in self.pending, f"job {job.id} claimed twice or never enqueued"
            kind, key = self.pending.pop(job.id)
            self.running[job.id] = (kind, key, job.attempt)
            self.starts.append((now, kind, key))

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        if not self.running:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.running)), min_size=1, max_size=4, unique=True))
        now = self.clock.now
        outcomes = [Outcome(i, "w", attempt=self.running[i][2], started_at=now) for i in ids]
        assert sorted(self.store.complete_many(outcomes, now)) == sorted(ids)
        for i in ids:
            del self.running[i]

    @rule(seconds=st.sampled_from([0.5, 2, 6, 11]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def one_running_job_per_key(self) -> None:
        keys = [key for kind, key, _ in self.running.values() if kind == KEYED]
        assert len(keys) == len(set(keys)), f"two running jobs share a key: {sorted(map(str, keys))}"

    @invariant()
    def no_window_holds_more_starts_than_its_count(self) -> None:
        for at, kind, key in self.starts:
            window, count = WINDOWS[kind]
            bucket = None if kind == KEYED else key  # KEYED's rate is type-wide
            inside = [
                s
                for s in self.starts
                if s[1] == kind and (kind == KEYED or s[2] == bucket) and at - timedelta(seconds=window) < s[0] <= at
            ]
            assert len(inside) <= count, f"{len(inside)} starts of {kind} ({bucket}) in {window} s up to {at}"

    @invariant()
    def a_pending_job_is_claimable_when_nothing_holds_it(self) -> None:
        """Nothing runs and every window has passed: the claim must find a job."""
        last = max((s[0] for s in self.starts), default=None)
        if not self.pending or self.running or (last is not None and self.clock.now - last < timedelta(seconds=11)):
            return
        before = len(self.pending)
        self.claim(1)
        assert len(self.pending) == before - 1, "a pending job was not claimed though no limit held it"


@pytest.fixture
def flow_deck(make_deck: Callable[..., Jobdeck]) -> Iterator[tuple[Jobdeck, Clock]]:
    clock = Clock()
    yield make_deck(clock=clock, types=LIMITS, sqlite_synchronous="NORMAL"), clock


def test_the_flow_claim_keeps_every_limit_under_random_operations(
    flow_deck: tuple[Jobdeck, Clock], backend: str
) -> None:
    deck, clock = flow_deck
    run_state_machine_as_test(
        lambda: FlowMachine(deck, clock),
        settings=settings(
            max_examples=12,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
