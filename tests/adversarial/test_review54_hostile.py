"""Review of three changes: ``.ci/run``'s check of the README's test command,
the quick tier without PostgreSQL twins (``tests/tiers.py``,
``tests/conftest.py``), and ``ProcessPool.summary()`` read under one lock
hold (``jobdeck.worker.processes``).

- The tiers: ``python3 -m pytest -m "quick or postgres_twin"`` was documented
  (docs/contributing.md, "The quick tier") to add the PostgreSQL runs to the
  quick tier; it also selected the twins of ``slow`` and ``adversarial``
  tests, which start child interpreters or fuzz (the page now gives an
  expression that holds, checked here). And the full run handed out
  tests in "quick last" order (``tiers.py``), documented as "the long tests
  (``slow``, ``e2e``, ``adversarial``) first and the quick ones after them":
  the twins, short tests that are not quick, are now handed out among the
  long ones.
- The summary: a pool of real children, crashed (SIGKILL), replaced and
  recycled by several threads while another reads ``summary()`` over and
  over; every summary must be one moment of the pool. This held (it pins
  the fix: the same checks on ``busy()``, ``children()`` and ``restarts``
  read apart, as before it, failed tens of thousands of times in 10 s).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from jobdeck.worker.processes import ProcessPool

REPO = Path(__file__).resolve().parents[2]
LONG = ("slow", "e2e", "adversarial")
# A backends file whose tests are all slow (child interpreters), and one whose
# tests are mostly quick: each has a PostgreSQL twin per test.
FILES = ("tests/test_api_workers.py", "tests/test_process_executor.py")


def collected(*args: str) -> list[str]:
    """The ids ``pytest --collect-only`` lists for ``FILES``, in run order."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *args]
    result = subprocess.run(
        [*command, *FILES], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ}
    )  # fmt: skip
    assert result.returncode in (0, 5), result.stdout + result.stderr
    return [line.strip() for line in result.stdout.splitlines() if "::" in line]


def documented_quick_with_twins() -> str:
    """The ``-m`` expression docs/contributing.md gives for the quick tier with its PostgreSQL runs."""
    page = " ".join((REPO / "docs" / "contributing.md").read_text(encoding="utf-8").split())
    found = re.search(r'`python3 -m pytest -m "([^"]+)"` is the quick tier with its tests\' PostgreSQL runs', page)
    assert found, "docs/contributing.md no longer gives the quick tier with its PostgreSQL runs"
    return found.group(1)


@pytest.mark.slow  # other interpreters (pytest collecting)
def test_the_quick_tier_with_its_twins_is_what_the_docs_say() -> None:
    """docs/contributing.md gives an expression for the quick tier with its
    tests' PostgreSQL runs. It must not bring in a slow, e2e or adversarial
    test (their twins are slow too), and must bring in each quick test's
    twin. ``-m "quick or postgres_twin"``, documented first, selected 3,143
    tests over the suite, 363 of them twins of slow or adversarial tests
    (the former quick tier with its twins: 2,780)."""
    selected = collected("-m", documented_quick_with_twins())
    long = set(collected("-m", " or ".join(LONG)))
    quick = collected("-m", "quick")
    assert selected, "nothing selected"
    brought_in = [test for test in selected if test in long]
    assert brought_in == [], f"{len(brought_in)} slow/adversarial tests selected, e.g. {brought_in[:3]}"
    twins = [test.replace("[sqlite]", "[postgres]") for test in quick if test.endswith("[sqlite]")]
    assert twins and sorted(selected) == sorted(quick + twins)


@pytest.mark.slow  # other interpreters (pytest collecting)
def test_the_full_run_hands_out_every_long_test_before_the_short_ones() -> None:
    """docs/contributing.md: "The long tests (slow, e2e, adversarial) are
    handed out first and the quick ones after them" (``tiers.py`` sorts so
    that the run ends on tests of a fraction of a second). The twins are
    short but sort with the long tests: on the whole suite, the last long
    test was at place 2,253 of 3,956, after 1,078 twins (place 1,175 before)."""
    order = collected()
    long = set(collected("-m", " or ".join(LONG)))
    last_long = max(i for i, test in enumerate(order) if test in long)
    short_first = [test for test in order[:last_long] if test not in long]
    assert short_first == [], f"{len(short_first)} short tests before the last long one, e.g. {short_first[:3]}"


# -- ProcessPool.summary(): one moment of the pool --------------------------------------------------

SIZE = 2
MAX_JOBS = 3
CYCLES = 120
"""Jobs each lending thread runs: crashes, replacements and recycles."""


def check(summary: dict[str, Any]) -> str | None:
    """What is wrong with ``summary`` as one moment of a started pool of
    ``SIZE`` whose children are replaced at once, or None."""
    children = summary["children"]
    pids = [c["pid"] for c in children]
    if len(set(pids)) != len(pids):
        return "a child listed twice"
    if len(children) != SIZE:
        return f"{len(children)} children listed, not {SIZE} (a replaced child listed, or a replacement missing)"
    if summary["busy"] != sum(1 for c in children if c["job_id"] is not None):
        return "busy disagrees with the children running a job"
    if any(c["jobs_run"] >= MAX_JOBS for c in children):
        return f"a child listed with jobs_run >= max_jobs_per_child {MAX_JOBS} (it is recycled at that count)"
    return None


@pytest.mark.slow  # child interpreters
def test_every_summary_is_one_moment_of_the_pool_while_children_crash_and_are_recycled() -> None:
    """Held: several threads borrow children and give them back, one in
    three SIGKILLed first (a crash), one in ten given back for a timeout,
    and every third job of a child recycles it, while a reader takes
    summaries; no summary lists a child twice, shows a replaced child or
    misses its replacement, counts busy children other than those with a
    job, or shows a child at its recycling count."""
    pool = ProcessPool(SIZE, max_jobs_per_child=MAX_JOBS)
    pool.start()
    done = threading.Event()
    wrong: list[tuple[str, dict[str, Any]]] = []
    failures: list[BaseException] = []
    summaries = [0]
    next_id = iter(range(1, 10**9))
    ids = threading.Lock()

    def lend(seed: int) -> None:
        try:
            for n in range(CYCLES):
                with ids:
                    job_id = next(next_id)
                child = pool.acquire(job_id, lambda: False)
                assert child is not None
                kind = (n * 7 + seed) % 10
                if kind < 3:  # a crash: the child dies during its job
                    os.kill(child.pid, signal.SIGKILL)
                    child.process.wait(10)
                    pool.release(child)
                elif kind == 3:
                    pool.release(child, "timeout")
                else:
                    pool.release(child)
        except BaseException as exc:  # noqa: BLE001  # reported by the test
            failures.append(exc)

    def read() -> None:
        while not done.is_set():
            summary = pool.summary()
            summaries[0] += 1
            problem = check(summary)
            if problem:
                wrong.append((problem, summary))

    lenders = [threading.Thread(target=lend, args=(seed,)) for seed in range(SIZE)]
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for t in lenders:
            t.start()
        for t in lenders:
            t.join(240)
            assert not t.is_alive(), "a lending thread hangs"
    finally:
        done.set()
        reader.join(30)
        pool.stop()
    assert not failures, failures
    assert not reader.is_alive(), "summary() hangs"
    restarts = pool.restarts
    assert restarts["crash"] > 0 and restarts["recycled"] > 0 and restarts["timeout"] > 0, dict(restarts)
    assert summaries[0] > 0
    assert wrong == [], f"{len(wrong)} of {summaries[0]} summaries wrong; first: {wrong[0]}"
    print(f"summaries {summaries[0]}, restarts {dict(sorted(restarts.items()))}, none torn")
