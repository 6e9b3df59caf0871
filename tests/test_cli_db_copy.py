"""``jobdeck db copy`` on the command line: progress on stderr, the counts
on stdout, and a refusal or a difference as exit status 1 with the reason.
(What the copy does is tested in ``tests/test_db_copy.py``.)"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobdeck.cli import main
from jobdeck.cli.db_copy import Progress
from jobdeck.store import transfer
from jobdeck.store.transfer import TableCount

from tests import transfer_support as support


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.pgtest import fresh_schema

    yield from fresh_schema(request)


def jobdeck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobdeck.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_the_copy_says_how_far_it_got_and_what_it_counted(
    tmp_path: Path, sqlite_template: Path, pg_target: str
) -> None:
    source = support.small(tmp_path, sqlite_template, jobs=40)
    done = jobdeck("db", "copy", "--from", source, "--to", pg_target, "--batch-size", "4")
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("copying jobs:")]
    assert progress == [f"copying jobs: {n} of 40 rows" for n in range(0, 41, 4)]
    assert re.search(r"^jobs +40 +40 +40$", done.stdout, re.M), done.stdout
    assert done.stdout.splitlines()[-1] == f"the counts match in all {len(transfer.copied_tables())} tables (40 rows)"

    again = jobdeck("db", "copy", "--from", source, "--to", pg_target)
    assert again.returncode == 0, again.stderr
    assert re.search(r"^jobs +40 +40 +0$", again.stdout, re.M), again.stdout


def test_a_refused_copy_exits_1_with_the_reason(tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path / 'target.db'}"
    missing = jobdeck("db", "copy", "--from", f"sqlite:///{tmp_path / 'none.db'}", "--to", target)
    assert missing.returncode == 1
    assert f"Error: no database at {tmp_path / 'none.db'}" in missing.stderr
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "target.db").exists()
    nonsense = CliRunner().invoke(main, ["db", "copy", "--from", "nonsense", "--to", target])
    assert nonsense.exit_code == 1 and "Error: not a database URL" in nonsense.output


@pytest.mark.postgres
@pytest.mark.slow
def test_a_target_with_other_data_exits_1(tmp_path: Path, sqlite_template: Path, pg_target: str) -> None:
    first = support.small(tmp_path, sqlite_template, jobs=3)
    assert jobdeck("db", "copy", "--from", first, "--to", pg_target).returncode == 0
    other = tmp_path / "other"
    other.mkdir()
    second = support.small(other, sqlite_template, jobs=4)
    refused = CliRunner().invoke(main, ["db", "copy", "--from", second, "--to", pg_target])
    assert refused.exit_code == 1
    assert "Error: the target already holds other data: jobs row 1 differs" in refused.output


def test_counts_that_differ_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = [TableCount("jobs", 3, 3, 3), TableCount("attempts", 5, 4, 4)]
    monkeypatch.setattr(transfer, "copy_database", lambda *args, **kwargs: counted)
    result = CliRunner().invoke(main, ["db", "copy", "--from", "sqlite:///a.db", "--to", "sqlite:///b.db"])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 1
    assert re.search(r"^attempts +5 +4 +4  MISMATCH$", result.output, re.M), result.output
    assert "the counts differ in 1 table(s): attempts" in result.output


def test_progress_says_each_tenth_and_nothing_for_empty_tables(capsys: pytest.CaptureFixture[str]) -> None:
    say = Progress()
    say("copying", "audit_log", 0, 0)
    for done in range(0, 1001, 10):
        say("copying", "jobs", done, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"copying jobs: {n} of 1000 rows" for n in range(0, 1001, 100)]
