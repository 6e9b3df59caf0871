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
LIFECYCLE = "app/store/lifecycle.py"
SQLITE = "app/store/sqlite.py"
QUEUES = "app/queues.py"


@dataclass(frozen=True)
class Mutation:
    file: str
    old: str
    new: str
    description: str


MUTATIONS: list[Mutation] = [
    Mutation(
        SQLITE,
        'f"AND status IN ({_quoted(sources(Transition.COMPLETE))}) RETURNING id, attempt"',
        '"RETURNING id, attempt"',
        "SQLite batched completion: drop status IN (...)",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.worker_id == worker_id,\n                jobs.c.status.in_(sources(Transition.COMPLETE)),\n",
        "                jobs.c.worker_id == worker_id,\n",
        "Core completion (PostgreSQL, with a result): drop status IN (...)",
    ),
    Mutation(
        SQLITE,
        "AND (id, attempt) IN (VALUES {pairs}) AND worker_id = ? ",
        "AND (id, attempt) IN (VALUES {pairs}) AND ? IS NOT NULL ",
        "SQLite batched completion: drop the worker_id fence",
    ),
    Mutation(
        LIFECYCLE,
        "                tuple_(jobs.c.id, jobs.c.attempt).in_([(o.job_id, o.attempt) for o in group]),\n"
        "                jobs.c.worker_id == worker_id,\n",
        "                tuple_(jobs.c.id, jobs.c.attempt).in_([(o.job_id, o.attempt) for o in group]),\n",
        "Core completion: drop the worker_id fence",
    ),
    Mutation(
        SQLITE,
        "AND (id, attempt) IN (VALUES {pairs})",
        "AND (id, id) IN (SELECT column1, column1 FROM (VALUES {pairs}))",
        "SQLite batched completion: drop the attempt fence",
    ),
    Mutation(
        LIFECYCLE,
        "tuple_(jobs.c.id, jobs.c.attempt).in_([(o.job_id, o.attempt) for o in group])",
        "jobs.c.id.in_([o.job_id for o in group])",
        "Core completion: drop the attempt fence",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.id == o.job_id,\n                jobs.c.attempt == attempt,\n",
        "                jobs.c.id == o.job_id,\n",
        "fail: drop the attempt fence",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.attempt == attempt,\n                jobs.c.worker_id == o.worker_id,\n",
        "                jobs.c.attempt == attempt,\n",
        "fail: drop the worker_id fence",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.worker_id == o.worker_id,\n                jobs.c.status.in_(sources(Transition.FAIL)),\n",
        "                jobs.c.worker_id == o.worker_id,\n",
        "fail: drop status IN (...)",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.id == job_id,\n                jobs.c.attempt == attempt,\n"
        "                jobs.c.worker_id == worker_id,\n",
        "                jobs.c.id == job_id,\n                jobs.c.worker_id == worker_id,\n",
        "set_progress: drop the attempt fence",
    ),
    Mutation(
        LIFECYCLE,
        ".where(jobs.c.id == job_id, jobs.c.worker_id == worker_id, jobs.c.status == _RUNNING)",
        ".where(jobs.c.id == job_id, jobs.c.status == _RUNNING)",
        "heartbeat: drop the worker_id fence",
    ),
    Mutation(
        LIFECYCLE,
        '        if self.dialect == "postgresql":\n            due = due.with_for_update(skip_locked=True)\n',
        "",
        "PostgreSQL claim: drop FOR UPDATE SKIP LOCKED",
    ),
    Mutation(
        SQLITE,
        '"available_at <= ?"]',
        '"? IS NOT NULL"]',
        "SQLite claim: ignore available_at",
    ),
    Mutation(
        LIFECYCLE,
        "            jobs.c.status.in_(sources(Transition.CLAIM)),\n            jobs.c.available_at <= now,\n",
        "            jobs.c.status.in_(sources(Transition.CLAIM)),\n",
        "PostgreSQL claim: ignore available_at",
    ),
    Mutation(
        SQLITE,
        'where = [f"status IN ({_quoted(sources(Transition.CLAIM))})", ',
        "where = [",
        "SQLite claim: drop status IN (...)",
    ),
    Mutation(
        SQLITE,
        'AND status IN ({_quoted(sources(Transition.CLAIM))}) "',
        '"',
        "SQLite claim_ids (the limited claim): drop status IN (...)",
    ),
    Mutation(
        SQLITE,
        "ORDER BY priority DESC, available_at, id LIMIT ?",
        "ORDER BY priority DESC, id LIMIT ?",
        "SQLite claim: order without available_at",
    ),
    Mutation(
        LIFECYCLE,
        "                jobs.c.worker_id == worker_id,\n                jobs.c.status.in_(sources(Transition.RELEASE)),\n",
        "                jobs.c.worker_id == worker_id,\n",
        "release: not checking status",
    ),
    Mutation(
        LIFECYCLE,
        ".where(jobs.c.id == job_id, jobs.c.status.in_(sources(Transition.RETRY)))",
        ".where(jobs.c.id == job_id, jobs.c.status.in_([*sources(Transition.RETRY), 'completed']))",
        "retry: from a state not in SOURCES (completed)",
    ),
    Mutation(
        LIFECYCLE,
        ".where(jobs.c.id.in_(list(ids)), jobs.c.status.in_(sources(Transition.DISCARD)))",
        ".where(jobs.c.id.in_(list(ids)))",
        "discard_ids: drop status IN (...)",
    ),
    Mutation(
        LIFECYCLE,
        "                for _ in range(3):  # the key's job deleted (retention) between the two: the key is free again\n"
        "                    inserted = conn.execute(stmt).first()\n",
        "                for _ in range(3):  # the key's job deleted (retention) between the two: the key is free again\n"
        "                    seen = conn.execute(select(jobs.c.id).where(jobs.c.idempotency_key == new.idempotency_key))\n"
        "                    if seen.first() is None:\n"
        "                        inserted = conn.execute(insert(jobs).values(values).returning(*_JOB_COLS)).first()\n"
        "                    else:\n"
        "                        inserted = None\n",
        "enqueue with a key: SELECT then INSERT instead of ON CONFLICT DO NOTHING",
    ),
    Mutation(
        LIFECYCLE,
        "                stmt = (\n                    self._insert()(jobs)\n"
        '                    .on_conflict_do_nothing(index_elements=["idempotency_key"])\n'
        "                    .returning(jobs.c.id, jobs.c.idempotency_key)\n",
        "                stmt = (\n                    self._insert()(jobs)\n"
        "                    .returning(jobs.c.id, jobs.c.idempotency_key)\n",
        "enqueue_many with keys: no ON CONFLICT DO NOTHING",
    ),
    Mutation(
        LIFECYCLE,
        "        row = self._current(conn, [job_id], lock=True).get(job_id)",
        "        row = self._current(conn, [job_id]).get(job_id)",
        "the HTTP worker's check (complete, fail): read without the row lock",
    ),
    Mutation(
        LIFECYCLE,
        "        with self._one_transaction() as conn:\n"
        "            row = self._held(conn, job_id, worker_id, Transition.COMPLETE)\n",
        "        with self.write() as check:\n"
        "            row = self._held(check, job_id, worker_id, Transition.COMPLETE)\n"
        "        with self._one_transaction() as conn:\n",
        "Store.complete: check in one transaction, complete in another",
    ),
    Mutation(
        QUEUES,
        "exclude_queues=paused, controlled=False",
        "exclude_queues=(), controlled=False",
        "queue policy: claim from paused queues",
    ),
    Mutation(
        QUEUES,
        "                    left_q[q] -= n\n",
        "                    left_q[q] -= 0\n",
        "queue policy: ignore the queue concurrency limit",
    ),
]


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
        env = dict(os.environ, PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1")
        if env.get("JOBDECK_TEST_POSTGRES_URL"):
            env["JOBDECK_REQUIRE_POSTGRES"] = "1"
        probe = subprocess.run(
            [sys.executable, "-c", "import app; print(app.__file__)"], cwd=dest, env=env, capture_output=True, text=True
        )
        if not probe.stdout.strip().startswith(str(dest)):
            return m, f"BROKEN RUN: the copy imports app from {probe.stdout.strip() or probe.stderr.strip()}", False
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
