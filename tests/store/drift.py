"""Prove the driver suite catches drift: break one guard at a time in a copy
of the tree and run ``pytest tests/store -x -q`` there.

    python tests/store/drift.py [--jobs N] [--only TEXT] [--list]

Prints one line per mutation: the first failing test, or NOT CAUGHT. Exits
non-zero if a mutation is not caught, if a run broke without a failing test,
or if a mutation's old text is not found exactly once (the code moved: update
the list below against the current code). Set JOBDECK_TEST_POSTGRES_URL so
the PostgreSQL variants run: several guards only matter there.

Not collected by pytest (no ``test_`` prefix); run it by hand after changing
the store.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATEMENTS = "app/store/statements.py"
ATTEMPTS = "app/store/attempt_statements.py"
OPERATORS = "app/store/operator_statements.py"
ENQUEUE = "app/store/enqueue.py"
FINISH = "app/store/finish.py"
HOLDING = "app/store/holding.py"
CONTROLS = "app/store/controls.py"
QUEUES = "app/jobs/queues.py"
LEDGER = "app/store/ledger.py"


@dataclass(frozen=True)
class Mutation:
    file: str
    old: str
    new: str
    description: str


# Each lifecycle statement is written once (app/store/*statements.py) and run
# by both dialects (Core on PostgreSQL, compiled once to text on SQLite), so
# each guard is broken once, where its statement applies it; the suite runs
# every test on both. The source states come from ``in_states(Transition.X)``:
# a transition's guard is dropped at its own call, and the shared helper is
# broken once on its own. ``INDEXED BY`` (SQLite) is a
# planner hint, not a guard: not mutated.
_COMPLETE_WHERE = ".where(_fenced(n, Transition.COMPLETE, by_rowid=True))"
_FENCE = {"status": 1, "worker": 2, "attempt": 3}
"""The clauses of ``_fenced``, counted from its end: ``status IN sources``,
``worker_id = worker``, ``(id, attempt) IN pairs`` (SQLite's statement also
names the ids alone, first)."""


def _complete_without(dropped: str, variant: str) -> str:
    """SQLite's completion's WHERE, for one variant of the statement (``plain``:
    ``complete(n)``, the batched acks; ``result``: ``complete(1, True)``, a
    completion with a result: ``Store.complete`` and the HTTP worker's),
    without the ``dropped`` clause of ``_fenced`` (PostgreSQL completes through
    ``complete_recorded``, mutated on its own below)."""
    clauses = "_fenced(n, Transition.COMPLETE, by_rowid=True).clauses"
    k = _FENCE[dropped]
    pick = f"and_(*(c for i, c in enumerate({clauses}) if i != len({clauses}) - {k}))"
    cond = "with_result" if variant == "result" else "not with_result"
    return f".where({pick} if {cond} else _fenced(n, Transition.COMPLETE, by_rowid=True))"


MUTATIONS: list[Mutation] = [
    # -- complete (SQLite): complete(n) (batched, no result) and complete(1, True) (with a result: Store.complete, HTTP)
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("status", "plain"),
             "complete (batched, no result): drop status IN (...)"),
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("status", "result"),
             "complete (with a result): drop status IN (...)"),
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("worker", "plain"),
             "complete (batched, no result): drop the worker_id fence"),
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("worker", "result"),
             "complete (with a result): drop the worker_id fence"),
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("attempt", "plain"),
             "complete (batched, no result): drop the attempt fence"),
    Mutation(ATTEMPTS, _COMPLETE_WHERE, _complete_without("attempt", "result"),
             "complete (with a result): drop the attempt fence"),
    # -- complete_recorded: PostgreSQL's batched completions, the pairs (and results) as arrays
    Mutation(ATTEMPTS, "        jobs.c.attempt == done.c.attempts,\n", "",
             "complete_recorded (PostgreSQL batches): drop the attempt fence"),
    Mutation(ATTEMPTS, "        jobs.c.attempt == done.c.attempts,\n        jobs.c.worker_id == bindparam(\"worker\"),\n",
             "        jobs.c.attempt == done.c.attempts,\n",
             "complete_recorded (PostgreSQL batches): drop the worker_id fence"),
    Mutation(ATTEMPTS, "        jobs.c.worker_id == bindparam(\"worker\"),\n        in_states(transition),\n    ]\n    return done, fence",
             "        jobs.c.worker_id == bindparam(\"worker\"),\n    ]\n    return done, fence",
             "complete_recorded (PostgreSQL batches): drop status IN (...)"),
    Mutation(ATTEMPTS, "fence += [jobs.c.workflow_id.is_(None), jobs.c.batch_id.is_(None)]",
             "fence += [jobs.c.batch_id.is_(None)]",
             "complete_recorded alone (PostgreSQL, autocommit): complete workflow jobs with no one to promote their dependents"),
    Mutation(ATTEMPTS, "fence += [jobs.c.workflow_id.is_(None), jobs.c.batch_id.is_(None)]",
             "fence += [jobs.c.workflow_id.is_(None)]",
             "complete_recorded alone (PostgreSQL, autocommit): complete batch jobs with no one to fire the batch's callback"),
    Mutation(ATTEMPTS, "case((cancelled, AttemptOutcome.CANCELLED.value), else_=AttemptOutcome.COMPLETED.value)",
             "case((cancelled, AttemptOutcome.COMPLETED.value), else_=AttemptOutcome.COMPLETED.value)",
             "complete_recorded (PostgreSQL batches): a cancelled job's attempt row says completed"),
    # -- fail, set_progress and snooze: one fence, ``held_attempt``, broken once on its own
    Mutation(ATTEMPTS, '        jobs.c.attempt == bindparam("job_attempt"),\n', "",
             "held attempt (fail, progress, snooze): drop the attempt fence"),
    Mutation(ATTEMPTS, '        jobs.c.worker_id == bindparam("worker"),\n        in_states(transition),\n    )\n',
             "        in_states(transition),\n    )\n", "held attempt (fail, progress, snooze): drop the worker_id fence"),
    Mutation(ATTEMPTS, '        jobs.c.worker_id == bindparam("worker"),\n        in_states(transition),\n    )\n',
             '        jobs.c.worker_id == bindparam("worker"),\n    )\n',
             "held attempt (fail, progress, snooze): drop status IN (...)"),
    Mutation(
        ATTEMPTS,
        '        values = {"status": ended, "finished_at": NOW}\n',
        '        values = {"status": case((jobs.c.retry_count < jobs.c.max_retries, State.FAILED.value),'
        ' else_=ended), "finished_at": NOW}\n',
        "fail: a non-retryable error retried while retries are left (not straight to dead)",
    ),
    # -- while running
    Mutation(
        ATTEMPTS,
        '.where(jobs.c.id == bindparam("job"), jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))',
        '.where(jobs.c.id == bindparam("job"), in_states(Transition.HEARTBEAT))',
        "heartbeat (one job): drop the worker_id fence",
    ),
    Mutation(
        ATTEMPTS,
        'held = select(jobs.c.id).where(jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))',
        "held = select(jobs.c.id).where(in_states(Transition.HEARTBEAT))",
        "heartbeat_worker (its jobs): drop the worker_id fence",
    ),
    Mutation(
        ATTEMPTS,
        'update(workers).where(workers.c.id == bindparam("worker"))',
        "update(workers).where(workers.c.id.is_not(None))",
        "heartbeat_worker (its row): beat every worker's row",
    ),
    # -- claim
    Mutation(
        STATEMENTS,
        "    return stmt.with_for_update(skip_locked=True) if lock else stmt\n",
        "    return stmt\n",
        "claim (PostgreSQL): drop FOR UPDATE SKIP LOCKED",
    ),
    Mutation(
        STATEMENTS,
        'with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(claimable())',
        'with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(in_states(Transition.CLAIM))',
        "claim: ignore available_at",
    ),
    Mutation(
        STATEMENTS,
        'with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(claimable())',
        'with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(jobs.c.available_at <= NOW)',
        "claim: drop status IN (...)",
    ),
    Mutation(
        STATEMENTS,
        "stmt.order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id)",
        "stmt.order_by(jobs.c.priority.desc(), jobs.c.id)",
        "claim: order without available_at",
    ),
    Mutation(
        STATEMENTS,
        '.where(jobs.c.id.in_(binds("id_", n, BigInteger())), claimable())',
        '.where(jobs.c.id.in_(binds("id_", n, BigInteger())), jobs.c.available_at <= NOW)',
        "claim_ids (the limited claim): drop status IN (...)",
    ),
    Mutation(
        STATEMENTS,
        ".join(claimed, claimed.c.id == start.c.id)",
        ".join(claimed, claimed.c.id == claimed.c.id)",
        "claim_ids_logging (PostgreSQL's flow claim): log each start once per job claimed, not its own job's",
    ),
    # -- release, rescue
    Mutation(
        ATTEMPTS,
        ".where(_fenced(n, Transition.RELEASE, by_rowid))",
        ".where(and_(*_fenced(n, Transition.RELEASE, by_rowid).clauses[:-1]))",
        "release: drop status IN (...)",
    ),
    Mutation(
        ATTEMPTS,
        ".where(in_states(Transition.RESCUE), jobs.c.heartbeat_at < cutoff, ~live_worker.exists())",
        ".where(jobs.c.heartbeat_at < cutoff, ~live_worker.exists())",
        "rescue_stalled: drop status IN (...)",
    ),
    Mutation(
        ATTEMPTS,
        ".where(in_states(Transition.RESCUE), jobs.c.heartbeat_at < cutoff, ~live_worker.exists())",
        ".where(in_states(Transition.RESCUE), jobs.c.heartbeat_at < cutoff)",
        "rescue_stalled: rescue the jobs of a worker still heart-beating",
    ),
    # -- operator actions
    Mutation(
        OPERATORS,
        "stmt = update(jobs).where(picked, in_states(Transition.RETRY)).values(values)",
        "stmt = update(jobs).where(picked, in_states(Transition.RETRY) if not one"
        " else (in_states(Transition.RETRY) | (jobs.c.status == 'completed'))).values(values)",
        "retry (one job): from a state not in SOURCES (completed)",
    ),
    Mutation(
        OPERATORS,
        "stmt = update(jobs).where(picked, in_states(Transition.RETRY)).values(values)",
        "stmt = update(jobs).where(picked, in_states(Transition.RETRY) if one"
        " else (in_states(Transition.RETRY) | (jobs.c.status == 'completed'))).values(values)",
        "retry_ids: from a state not in SOURCES (completed)",
    ),
    Mutation(
        OPERATORS,
        ".where(picked, in_states(Transition.DISCARD))",
        ".where(picked, in_states(Transition.DISCARD) if not one else jobs.c.id.is_not(None))",
        "discard (one job): drop status IN (...)",
    ),
    Mutation(
        OPERATORS,
        ".where(picked, in_states(Transition.DISCARD))",
        ".where(picked, in_states(Transition.DISCARD) if one else jobs.c.id.is_not(None))",
        "discard_ids: drop status IN (...)",
    ),
    Mutation(
        OPERATORS,
        '.where(jobs.c.id == bindparam("job"), in_states(Transition.RUN_NOW), jobs.c.available_at > NOW)',
        '.where(jobs.c.id == bindparam("job"), jobs.c.available_at > NOW)',
        "run_now: drop status IN (...)",
    ),
    Mutation(
        STATEMENTS,
        "    return status_in(jobs.c.status, sources(transition))\n",
        "    return status_in(jobs.c.status, [s.value for s in State])\n",
        "in_states (the shared helper): every state is a source of every transition",
    ),
    # -- cancel: its guard, and the cancel request each finishing statement honours
    Mutation(OPERATORS, ".where(picked, in_states(Transition.CANCEL))", ".where(picked)",
             "cancel: drop status IN (...)"),
    Mutation(
        OPERATORS,
        "at_once = status_in(jobs.c.status, [s.value for s in ALL_STATES if s in CANCEL_AT_ONCE])",
        "at_once = status_in(jobs.c.status, [s.value for s in ALL_STATES if s in CANCEL_AT_ONCE or s is State.RUNNING])",
        "cancel: a running job cancelled at once (its attempt still running)",
    ),
    Mutation(ATTEMPTS, '        "status": cancelled_or(State.COMPLETED),', '        "status": State.COMPLETED.value,',
             "cancel request ignored by complete (the job completes)"),
    Mutation(
        ATTEMPTS,
        "        left = and_(jobs.c.retry_count < jobs.c.max_retries, ~cancel_requested())\n",
        "        left = jobs.c.retry_count < jobs.c.max_retries\n",
        "cancel request ignored by fail, timeout and rescue (the job is retried)",
    ),
    Mutation(ATTEMPTS, '"status": cancelled_or(State.PENDING)', '"status": State.PENDING.value',
             "cancel request ignored by release (the job goes back to pending)"),
    # -- enqueue with idempotency keys
    Mutation(
        ENQUEUE,
        "            inserted = self._run(conn, insert, values).first()\n",
        "            seen = conn.execute(statements.job_by_key(), {\"key\": new.idempotency_key}).first()\n"
        "            inserted = None if seen else self._run(conn, statements.enqueue(\"row\"), values).first()\n",
        "enqueue with a key: SELECT then INSERT instead of ON CONFLICT DO NOTHING",
    ),
    Mutation(
        STATEMENTS,
        "    return Prepared(stmt.returning(jobs.c.id, jobs.c.idempotency_key), JOB_FIELDS)\n",
        "    plain = insert(jobs).values(_job_values())\n"
        "    return Prepared(plain.returning(jobs.c.id, jobs.c.idempotency_key), JOB_FIELDS)\n",
        "enqueue_many with keys: no ON CONFLICT DO NOTHING",
    ),
    Mutation(
        STATEMENTS,
        "    if keyed:\n        stmt = stmt.on_conflict_do_nothing(**KEYED_CONFLICT)\n"
        "    return stmt.returning(jobs.c.id, jobs.c.idempotency_key, _woke())\n",
        "    return stmt.returning(jobs.c.id, jobs.c.idempotency_key, _woke())\n",
        "enqueue_many with keys (PostgreSQL, unnest): no ON CONFLICT DO NOTHING",
    ),
    Mutation(
        STATEMENTS,
        "    if keyed:\n        stmt = stmt.on_conflict_do_nothing(**KEYED_CONFLICT)\n"
        "    return Prepared(stmt.returning(jobs.c.id, _woke()), JOB_FIELDS)\n",
        "    return Prepared(stmt.returning(jobs.c.id, _woke()), JOB_FIELDS)\n",
        "enqueue with a key (PostgreSQL, autocommit): no ON CONFLICT DO NOTHING",
    ),
    Mutation(
        STATEMENTS,
        '    "index_where": jobs.c.idempotency_key.is_not(None),\n',
        "",
        "enqueue with a key: ON CONFLICT without the partial index's predicate",
    ),
    # -- the HTTP worker's complete and fail: check and transition in one transaction, the row locked
    Mutation(
        HOLDING,
        "        row = self._current(conn, [job_id], lock=True).get(job_id)\n",
        "        row = self._current(conn, [job_id]).get(job_id)\n",
        "the HTTP worker's check (complete, fail): read without the row lock",
    ),
    Mutation(
        FINISH,
        "        with self._one_transaction() as conn:\n"
        "            row = self._held(conn, job_id, worker_id, Transition.COMPLETE)\n",
        "        with self.write() as check:\n"
        "            row = self._held(check, job_id, worker_id, Transition.COMPLETE)\n"
        "        with self._one_transaction() as conn:\n",
        "Store.complete: check in one transaction, complete in another",
    ),
    Mutation(
        FINISH,
        "        with self._one_transaction() as conn:\n"
        "            row = self._held(conn, job_id, worker_id, Transition.FAIL)\n",
        "        with self.write() as check:\n"
        "            row = self._held(check, job_id, worker_id, Transition.FAIL)\n"
        "        with self._one_transaction() as conn:\n",
        "Store.fail: check in one transaction, fail in another",
    ),
    # -- queue policy
    Mutation(
        QUEUES,
        "exclude_queues=paused, controlled=False",
        "exclude_queues=(), controlled=False",
        "queue policy (no limits): claim from paused queues",
    ),
    Mutation(
        QUEUES,
        "            skip_q = list(paused) + [",
        "            skip_q = [",
        "queue policy (limited claim): claim from paused queues",
    ),
    Mutation(
        QUEUES,
        "                        left_q[queue] -= 1\n",
        "                        left_q[queue] -= 0\n",
        "queue policy: ignore the queue concurrency limit within one claim",
    ),
    Mutation(
        CONTROLS,
        '("queue", list(limited_queues))',
        '("queue", [])',
        "queue policy: the limit does not count the jobs already running",
    ),
    # -- the effects ledger's HTTP steps (tests/store/test_driver_effects.py)
    Mutation(LEDGER, "            if row.status != State.RUNNING.value:\n", "            if False:\n",
             "effect start (HTTP): drop the running check of the attempt's fence"),
    Mutation(LEDGER, "            if row.worker_id != worker_id:\n", "            if False:\n",
             "effect start (HTTP): drop the worker check of the attempt's fence"),
    Mutation(LEDGER, "            if row.attempt != attempt:\n", "            if False:\n",
             "effect start (HTTP): drop the attempt check of the attempt's fence"),
    Mutation(LEDGER, "NOT_PERFORMED.value]),\n                *_by(worker_id),\n", "NOT_PERFORMED.value]),\n",
             "effect finish (HTTP): drop the worker_id fence"),
    Mutation(LEDGER, "effects.c.state == _STARTED,\n                *_by(worker_id),\n",
             "effects.c.state == _STARTED,\n", "effect withdraw (HTTP): drop the worker_id fence"),
]  # fmt: skip


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    return [line for line in out.splitlines() if line and (root / line).is_file()]


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def where_found(root: Path, m: Mutation) -> int:
    path = root / m.file
    return path.read_text().count(m.old) if path.exists() else 0


FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)


def run_one(root: Path, files: list[str], m: Mutation, timeout: float) -> tuple[Mutation, str, bool]:
    """(mutation, what happened, caught?)."""
    with tempfile.TemporaryDirectory(prefix="jobdeck-drift-") as tmp:
        dest = Path(tmp)
        copy_tree(root, files, dest)
        path = dest / m.file
        path.write_text(path.read_text().replace(m.old, m.new, 1))
        (dest / "jobdeck").symlink_to("app")  # the import name of the copy's app/ (an install maps it)
        env = dict(os.environ, PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1")
        if env.get("JOBDECK_TEST_POSTGRES_URL"):
            env["JOBDECK_REQUIRE_POSTGRES"] = "1"
        probe = subprocess.run(
            [sys.executable, "-c", "import jobdeck; print(jobdeck.__file__)"],
            cwd=dest,
            env=env,
            capture_output=True,
            text=True,
        )
        if not probe.stdout.strip().startswith(str(dest)):
            return m, f"BROKEN RUN: the copy imports jobdeck from {probe.stdout.strip() or probe.stderr.strip()}", False
        cmd = [sys.executable, "-m", "pytest", "tests/store", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
        try:
            done = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return m, f"BROKEN RUN: timed out after {timeout:.0f} s", False
    if done.returncode == 0:
        return m, "NOT CAUGHT", False
    found = FAILED_LINE.search(done.stdout)
    if found is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return m, f"BROKEN RUN (exit {done.returncode}): {' | '.join(tail)}", False
    return m, found.group(2), True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (default 2)")
    parser.add_argument(
        "--only", action="append", default=[], help="only mutations whose description contains this (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--list", action="store_true", help="list the mutations and check their texts, run nothing")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(o.lower() in m.description.lower() for o in args.only)]
    if not os.environ.get("JOBDECK_TEST_POSTGRES_URL"):
        print("warning: JOBDECK_TEST_POSTGRES_URL is unset: the PostgreSQL variants skip", file=sys.stderr)

    moved = [(m, n) for m in chosen if (n := where_found(ROOT, m)) != 1]
    for m, n in moved:
        print(f"OLD TEXT {'NOT FOUND' if n == 0 else f'FOUND {n} TIMES'} in {m.file}: {m.description}")
    if args.list:
        for m in chosen:
            print(f"{m.file}: {m.description}")
        return 1 if moved else 0
    runnable = [m for m in chosen if (m, where_found(ROOT, m)) not in moved]

    files = tracked_files(ROOT)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda m: run_one(ROOT, files, m, args.timeout), runnable))

    width = max((len(m.description) for m, _, _ in results), default=10)
    print(f"{'mutation':<{width}}  first failing test")
    print(f"{'-' * width}  {'-' * 40}")
    for m, outcome, _ in results:
        print(f"{m.description:<{width}}  {outcome}")
    missed = [m for m, _, caught in results if not caught]
    print(f"\n{len(results) - len(missed)} of {len(results)} caught; {len(moved)} with old text not found once")
    return 1 if missed or moved else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
