"""The job state machine, defined once.

Every other module derives its vocabulary from here: the database CHECK
constraint, the store's conditional UPDATEs, the API's status filter, the
dashboard's tabs and the buttons offered per state.
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    """The state a job is in. The value is what the database stores."""

    PENDING = "pending"
    """Waiting to run. Shown as *scheduled* while ``available_at`` is in the
    future. Entered by enqueue, release (graceful shutdown), snooze (the
    handler asked to run again later) and operator retry; left by claim
    (when due) or discard."""

    RUNNING = "running"
    """Claimed by a worker, which heart-beats it. Left by complete, fail,
    release, or the stalled sweep when the heartbeat stops. A cancel leaves
    it running with ``cancel_requested_at`` set: whichever of those ends the
    attempt then ends the job ``cancelled`` instead."""

    FAILED = "failed"
    """The last attempt failed and a retry is scheduled at ``available_at``
    (backoff). Claimable again once due."""

    DEAD = "dead"
    """Dead letter: attempts exhausted, non-retryable, or stalled with no
    retries left. Waits for a person to retry or discard it."""

    COMPLETED = "completed"
    """Done. Deleted by retention after the configured age."""

    DISCARDED = "discarded"
    """A person discarded it. Deleted by retention like completed jobs."""

    CANCELLED = "cancelled"
    """A person or the API cancelled it (``Jobdeck.cancel``): at once from
    pending or failed; from running cooperatively, when the attempt ends,
    however it ends (complete, fail, timeout, stall, release). Never claimed,
    never retried; deleted by retention like completed jobs."""

    BLOCKED = "blocked"
    """A workflow job waiting for its dependencies (``jobdeck.jobs.workflows``); never
    claimable. Entered at enqueue when it has dependencies. Left by promote
    (the completion of its last unfinished dependency moves it to
    ``pending`` in the same transaction), by a dependency ending dead,
    cancelled or discarded (it is then ``cancelled``, "dependency X is
    dead", unless its ``on_dependency_failure`` is ``hold``: then it stays
    blocked until a person retries that dependency; a cancelled dependency,
    which cannot be retried, cancels it anyway), or by a cancel."""

    def __str__(self) -> str:
        return self.value


ALL_STATES: tuple[State, ...] = tuple(State)
CLAIMABLE: frozenset[State] = frozenset({State.PENDING, State.FAILED})
FINISHED: frozenset[State] = frozenset({State.COMPLETED, State.DISCARDED, State.CANCELLED})
"""Done for good: what retention deletes after ``completed_days``."""
ENDED: frozenset[State] = FINISHED | {State.DEAD}
"""Ran its course for now: what a batch waits for (a dead job may still be retried)."""
DEPENDENCY_FAILED: frozenset[State] = frozenset({State.DEAD, State.CANCELLED, State.DISCARDED})
"""A dependency in one of these will not complete by itself: its blocked
dependents are cancelled, or held (``on_dependency_failure``)."""
SCHEDULED = "scheduled"
"""Not a state of its own: ``pending`` with ``available_at`` in the future."""


class GroupState(str, enum.Enum):
    """Where a workflow stands, read from its jobs' states and never stored
    (``jobdeck.store.graph.group_state``). Each ended value is the job state
    of the same name."""

    RUNNING = State.RUNNING.value
    """A job of it can still run: pending, running, failed, or blocked
    behind one of those."""

    HELD = "held"
    """Only blocked jobs are left: they wait for a person to retry a failed
    dependency (``on_dependency_failure = "hold"``)."""

    COMPLETED = State.COMPLETED.value
    """Every job completed."""

    DEAD = State.DEAD.value
    """Nothing can run any more and a job is dead: it waits for a person."""

    CANCELLED = State.CANCELLED.value
    """Nothing can run any more, no job is dead, and not every job
    completed (some were cancelled or discarded)."""

    def __str__(self) -> str:
        return self.value


LIVE_GROUP: frozenset[GroupState] = frozenset({GroupState.RUNNING, GroupState.HELD})
"""A workflow that may still move, by itself or by a person's retry."""


class BatchState(str, enum.Enum):
    """Where a batch stands (``jobdeck.jobs.workflows.Batch``), read from
    its row's times."""

    OPEN = "open"
    """Jobs may still be added; its callbacks wait for it to be closed."""

    RUNNING = State.RUNNING.value
    """Closed: its callbacks fire once every job in it has ended."""

    FIRED = "fired"
    """Its callbacks were enqueued; it changes no more."""

    def __str__(self) -> str:
        return self.value


class EffectState(str, enum.Enum):
    """Where one side effect of the effects ledger stands (``ctx.effect``).

    The ledger is two-phase: the key is recorded ``started`` before the side
    effect and ``done`` after it, so a crash between the two is visible as
    a ``started`` row nobody finished: an outcome nobody knows."""

    STARTED = "started"
    """Recorded by attempt N just before it performed the effect. If it is
    still ``started`` when another attempt reaches the same key, that attempt
    cannot know whether the effect happened: the job goes to ``dead`` for a
    person (unless the effect is replay-safe). Left by done, by not
    performed (``EffectNotPerformed``), or by an operator's resolve."""

    DONE = "done"
    """The effect happened; its result is stored. Every later attempt
    returns that result instead of performing the effect again."""

    NOT_PERFORMED = "not_performed"
    """The effect certainly did not happen (its function raised
    ``EffectNotPerformed``, or a person said so): the next attempt that
    reaches the key performs it, moving it back to ``started``."""

    def __str__(self) -> str:
        return self.value


class AttemptOutcome(str, enum.Enum):
    """How one attempt of a job ended: the ``outcome`` of its row in
    ``attempts`` (the value is what the database stores, and what the CHECK
    on that column lists)."""

    COMPLETED = "completed"
    """The handler returned; the job is ``completed`` (``Store.complete_many``)."""

    FAILED = "failed"
    """The handler raised, or an HTTP worker reported a failure; the fail rule
    moved the job to ``failed`` or ``dead`` (``Store.fail_many``)."""

    TIMED_OUT = "timed_out"
    """The handler ran past its timeout; the pool failed the attempt like a
    raised error."""

    STALLED = "stalled"
    """The worker stopped heart-beating; the stalled sweep failed the attempt
    (``Store.rescue_stalled``)."""

    INTERRUPTED = "interrupted"
    """Shutdown cut the handler short; the job went back to ``pending`` with no
    retry counted (``Store.release``). Not a failure: the roll-up of failures
    leaves it out."""

    CANCELLED = "cancelled"
    """The job was cancelled while this attempt ran, and the attempt ended
    (returned, raised, timed out, stalled or was released): the job is
    ``cancelled``, not completed or retried. The row's error says how the
    attempt itself ended."""

    SNOOZED = "snoozed"
    """The handler returned or raised ``Snooze(seconds)`` (``jobdeck.jobs.snooze``):
    the job went back to ``pending``, due ``seconds`` later, with no retry
    counted (``Store.snooze_many``). The row keeps the delay
    (``snooze_seconds``). Not a failure: the roll-up of failures leaves it
    out."""

    def __str__(self) -> str:
        return self.value


ALL_OUTCOMES: tuple[AttemptOutcome, ...] = tuple(AttemptOutcome)


ALL_EFFECT_STATES: tuple[EffectState, ...] = tuple(EffectState)
EFFECT_RESOLUTIONS: frozenset[EffectState] = frozenset({EffectState.DONE, EffectState.NOT_PERFORMED})
"""What a person may mark an unknown (``started``) effect as."""


class Transition(str, enum.Enum):
    """Every way a job moves. Each is one conditional statement in the store."""

    CLAIM = "claim"
    COMPLETE = "complete"
    FAIL = "fail"
    HEARTBEAT = "heartbeat"
    RELEASE = "release"
    RESCUE = "rescue"
    RETRY = "retry"
    DISCARD = "discard"
    RUN_NOW = "run_now"
    """An operator makes a scheduled or retrying job due now (``available_at = now``)."""
    CANCEL = "cancel"
    """A person or the API cancels a job: pending, failed or blocked ones at once; a
    running one gets a cancel request and ends ``cancelled`` when its attempt
    ends. Dead jobs are discarded instead (Oban's cancel also leaves its
    discarded jobs alone); finished ones have nothing left to cancel."""
    SNOOZE = "snooze"
    """The handler asks to run again later (``jobdeck.jobs.snooze.Snooze``): running
    -> pending, due ``seconds`` from now, retry count unchanged; fenced by
    (job, attempt, worker) like complete and fail. A job cancelled while it
    ran ends ``cancelled`` instead."""
    PROMOTE = "promote"
    """A blocked workflow job's last unfinished dependency completed: blocked
    -> pending, due now, in the completion's own transaction (``jobdeck.store.graph``)."""
    EDIT = "edit"
    """An operator changes a waiting job's payload, priority, queue or run-at; a dead one is retried too."""


# Allowed source states of each transition. The store's WHERE clauses and the
# dashboard's buttons both read this table.
SOURCES: dict[Transition, frozenset[State]] = {
    Transition.CLAIM: frozenset({State.PENDING, State.FAILED}),
    Transition.COMPLETE: frozenset({State.RUNNING}),
    Transition.FAIL: frozenset({State.RUNNING}),
    Transition.HEARTBEAT: frozenset({State.RUNNING}),
    Transition.RELEASE: frozenset({State.RUNNING}),
    Transition.RESCUE: frozenset({State.RUNNING}),
    Transition.RETRY: frozenset({State.FAILED, State.DEAD, State.DISCARDED}),
    Transition.DISCARD: frozenset({State.PENDING, State.FAILED, State.DEAD}),
    # Only while not yet due (available_at > now): a due job is the claim's already.
    Transition.RUN_NOW: frozenset({State.PENDING, State.FAILED}),
    Transition.CANCEL: frozenset({State.PENDING, State.RUNNING, State.FAILED, State.BLOCKED}),
    Transition.PROMOTE: frozenset({State.BLOCKED}),
    Transition.EDIT: frozenset({State.PENDING, State.FAILED, State.DEAD}),
    Transition.SNOOZE: frozenset({State.RUNNING}),
}

# Possible destination states, for documentation and table-driven tests.
TARGETS: dict[Transition, frozenset[State]] = {
    Transition.CLAIM: frozenset({State.RUNNING}),
    Transition.COMPLETE: frozenset({State.COMPLETED}),
    Transition.FAIL: frozenset({State.FAILED, State.DEAD}),
    Transition.HEARTBEAT: frozenset({State.RUNNING}),
    Transition.RELEASE: frozenset({State.PENDING}),
    Transition.RESCUE: frozenset({State.FAILED, State.DEAD}),
    Transition.RETRY: frozenset({State.PENDING}),
    Transition.DISCARD: frozenset({State.DISCARDED}),
    Transition.RUN_NOW: frozenset({State.PENDING, State.FAILED}),
    # A running job stays running (cancel requested) until its attempt ends.
    Transition.CANCEL: frozenset({State.CANCELLED, State.RUNNING}),
    Transition.EDIT: frozenset({State.PENDING, State.FAILED}),
    Transition.SNOOZE: frozenset({State.PENDING, State.CANCELLED}),
    Transition.PROMOTE: frozenset({State.PENDING}),
}

CANCEL_AT_ONCE: frozenset[State] = SOURCES[Transition.CANCEL] - {State.RUNNING}
"""The states a cancel moves to ``cancelled`` at once (no attempt is running)."""


def sources(transition: Transition) -> list[str]:
    """The allowed source states as database values, in a stable order."""
    return [s.value for s in ALL_STATES if s in SOURCES[transition]]


def allowed(transition: Transition, state: State | str) -> bool:
    return State(state) in SOURCES[transition]


def refusal(job_id: int, state: State | str, transition: Transition) -> str:
    """The message shown when a transition is refused, e.g.
    "job 42 is completed; only running jobs can be failed"."""
    names = " or ".join(s.value for s in ALL_STATES if s in SOURCES[transition])
    verb = _PAST[transition]
    return f"job {job_id} is {State(state).value}; only {names} jobs can be {verb}"


_PAST = {
    Transition.CLAIM: "claimed",
    Transition.COMPLETE: "completed",
    Transition.FAIL: "failed",
    Transition.HEARTBEAT: "heart-beaten",
    Transition.RELEASE: "released",
    Transition.RESCUE: "rescued",
    Transition.RETRY: "retried",
    Transition.DISCARD: "discarded",
    Transition.RUN_NOW: "run now",
    Transition.CANCEL: "cancelled",
    Transition.EDIT: "edited",
    Transition.SNOOZE: "snoozed",
    Transition.PROMOTE: "promoted",
}


# Priority labels: derived for display, accepted on input.
PRIORITY_LABELS: dict[str, int] = {"low": 0, "medium": 10, "high": 20, "critical": 30}


def priority_label(priority: int) -> str:
    """The highest label whose value does not exceed ``priority``."""
    label = "low"
    for name, value in PRIORITY_LABELS.items():
        if priority >= value:
            label = name
    return label
