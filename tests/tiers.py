"""The suite's tiers and how its tests share the machine (a pytest plugin,
loaded by ``tests/conftest.py``).

- Every test under ``tests/adversarial/`` is marked ``adversarial``; every
  test marked none of ``slow``, ``e2e``, ``adversarial`` and
  ``postgres_twin`` is marked ``quick``: ``python3 -m pytest -m quick`` is
  the edit-test loop. A ``postgres_twin`` is the PostgreSQL run of a test
  that also runs on SQLite (``backends``): the quick tier runs its SQLite
  run, which costs about half as much, and the full run runs both. Tests
  of PostgreSQL alone stay quick.
- The run is spread over processes by pytest-xdist (``-n`` in pyproject's
  ``addopts``). A test marked ``alone`` (timing-sensitive, several
  processes) runs with no other test of the run beside it: it takes a
  file lock exclusively, every other test takes it shared. A waiting
  ``alone`` test first takes a gate that new tests must pass, so a stream
  of short tests cannot keep it waiting. Runs that share a machine at once
  can share the locks when ``JOBDECK_TEST_LOCKS`` names one folder for all
  of them (CI's quick tiers on other Pythons run at a low CPU priority
  instead, .ci/run).
- What each passed adversarial test prints (its figures: cases fuzzed,
  kills, lost jobs, recovery times) is gathered into the run's summary,
  "adversarial figures". These hooks live here, not in
  ``tests/adversarial/conftest.py``: xdist's controller, which reports the
  run, never loads that file (it collects nothing), and the section had
  gone from every parallel run's log.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ADVERSARIAL = HERE / "adversarial"
LONG = ("slow", "e2e", "adversarial")
"""The long tests' markers: handed out first."""
NOT_QUICK = (*LONG, "postgres_twin")
LOCKS = "jobdeck_locks"
"""The key, in xdist's worker input, of the folder that holds this run's locks."""
SHARED = "JOBDECK_TEST_LOCKS"
"""An environment variable: a folder of locks shared with other runs."""
_folder = pytest.StashKey[Path]()
_FIGURES: list[tuple[str, str]] = []
"""(test id, what it printed) of this process's passed adversarial tests."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ADVERSARIAL in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.adversarial)
        if not any(item.get_closest_marker(name) for name in NOT_QUICK):
            item.add_marker(pytest.mark.quick)
    # The long tests first, the short ones after them (each group in its own
    # order): xdist hands tests out in this order, so the run ends on tests
    # of a fraction of a second that fill whatever cores are free, not on a
    # multi-process test that waits most of its time while the others sit idle.
    # A PostgreSQL twin of a quick test is short, though not quick.
    items.sort(key=lambda item: not any(item.get_closest_marker(name) for name in LONG))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        shared = os.environ.get(SHARED)
        config.stash[_folder] = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="jobdeck-test-locks-"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep what a passed adversarial test printed, for the run's summary
    (in the controller, from the workers' reports, under xdist)."""
    if report.when == "call" and report.passed and "adversarial" in report.keywords and report.capstdout.strip():
        _FIGURES.append((report.nodeid, report.capstdout.strip()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("adversarial figures")
        for nodeid, text in _FIGURES:
            terminalreporter.write_line(f"{nodeid}:")
            for line in text.splitlines():
                terminalreporter.write_line(f"    {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_folder, None)
    if folder is not None and not os.environ.get(SHARED):
        shutil.rmtree(folder, ignore_errors=True)


PER_CORE = 2
"""Test processes per core for ``-n auto``."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: ``PER_CORE`` test processes per core. Most tests spend
    their time waiting (on a server or worker process they started, on the
    database, on a deadline), not computing: with one process per core the
    run kept the cores a third busy."""
    return PER_CORE * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist (controller): tell each worker where this run's locks are."""
    node.workerinput[LOCKS] = str(node.config.stash[_folder])


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    """Hold this test's share of the machine: exclusive for ``alone``."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is not None and LOCKS in workerinput:
        folder = Path(workerinput[LOCKS])
    elif os.environ.get(SHARED):  # one process, beside other runs
        folder = Path(os.environ[SHARED])
    else:  # one process alone: every test is alone
        yield
        return
    gate, machine = folder / "gate", folder / "machine"
    if item.get_closest_marker("alone"):
        with _flock(gate, fcntl.LOCK_EX), _flock(machine, fcntl.LOCK_EX):
            yield
        return
    with _flock(gate, fcntl.LOCK_EX):
        held = _flock(machine, fcntl.LOCK_SH)
        held.__enter__()
    try:
        yield
    finally:
        held.__exit__(None, None, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    with _turn(item):
        return (yield)
