"""The adversarial tier: API fuzzing, state-machine properties, the crash
matrix and database faults. Every test under this folder carries the
``adversarial`` marker (``tests/tiers.py``), so ``pytest -m adversarial``
runs the tier alone and CI runs it with everything else; the figures the
tier's tests print are gathered into the run's summary."""

from __future__ import annotations

import pytest

_FIGURES: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep what each passed adversarial test printed (its figures: cases
    fuzzed, kills, lost jobs, recovery times) for the run's summary."""
    if report.when == "call" and report.passed and "adversarial" in report.keywords and report.capstdout.strip():
        _FIGURES.append((report.nodeid, report.capstdout.strip()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("adversarial figures")
        for nodeid, text in _FIGURES:
            terminalreporter.write_line(f"{nodeid}:")
            for line in text.splitlines():
                terminalreporter.write_line(f"    {line}")
