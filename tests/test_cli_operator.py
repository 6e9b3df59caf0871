"""The operator's job commands (jobs, show, retry, discard) on a real SQLite
file, set up through a deck on the same file; the --create refusal as a real
process run from another folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from jobdeck import cli, create_app
from jobdeck.cli import main
from jobdeck.core.states import ALL_STATES, State, Transition
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.present import attempts_allowed
from jobdeck.store import Outcome, Store
from jobdeck.store.audit import AuditRecord, list_audit
from jobdeck.store.reads import BATCH
from jobdeck.web.serialize import job_json

from tests.dashboard_support import make_dead
from tests.test_cli import ROOT, jobdeck_env

TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@pytest.fixture
def run(tmp_path: Path) -> Any:
    """``jobdeck ARGS`` in this process, on the test's SQLite file."""
    env = jobdeck_env(tmp_path)

    def invoke(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, list(args), env=env, input=input)

    return invoke


def dead_jobs(deck: Jobdeck, job_type: str, n: int) -> list[int]:
    """``n`` jobs run once and failed for good, claimed and failed in batches."""
    ids = deck.enqueue_many([{"type": job_type, "max_retries": 0} for _ in range(n)])
    while claimed := deck.store.claim("w1", deck.clock(), limit=250, types=[job_type]):
        deck.store.fail_many([Outcome(j.id, "w1", error="boom") for j in claimed], deck.clock())
    return ids


def audit(deck: Jobdeck) -> list[AuditRecord]:
    return list(reversed(list_audit(deck.store, limit=1000)[0]))


def rows(result: Result) -> list[list[str]]:
    """The listing's cells split on runs of two spaces (type names hold none)."""
    return [re.split(r"\s{2,}", line.strip()) for line in result.stdout.splitlines()[1:]]


# -- jobs -------------------------------------------------------------------------


def test_jobs_prints_a_header_the_times_and_the_queue(run, live_deck: Jobdeck) -> None:
    due, _ = live_deck.enqueue("demo.noop", queue="reports")
    later, _ = live_deck.enqueue("demo.send-email", {"user_id": "u1"}, delay_seconds=3600)
    dead = make_dead(live_deck)
    result = run("jobs")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split()
    assert header[:5] == ["ID", "STATUS", "TYPE", "QUEUE", "ATTEMPTS"] and "ERROR" in header
    by_id = {int(r[0]): r for r in rows(result)}
    assert list(by_id) == [dead, later.id, due.id]  # newest first
    assert by_id[due.id][1:5] == ["pending", "demo.noop", "reports", "0/4"]
    assert by_id[dead][4] == "1/1"  # made / allowed, as the dashboard counts them
    assert by_id[later.id][1] == "scheduled"
    assert by_id[dead][1] == "dead" and by_id[dead][-1] == "boom"
    assert all(TIME.fullmatch(cell) for cell in by_id[due.id][5:7])
    # A scheduled job's own time is when it is due, an hour from its creation.
    assert by_id[later.id][6] > by_id[later.id][5]
    assert result.stderr.startswith("database: sqlite:///") and "jobdeck.db" in result.stderr


def test_jobs_counts_attempts_and_words_a_recovered_error_like_the_dashboard(run, live_deck: Jobdeck) -> None:
    live_deck.config.backoff_base = 3600
    job, _ = live_deck.enqueue("demo.fail", max_retries=2)
    live_deck.store.claim("w1", live_deck.clock(), limit=1)
    live_deck.store.fail_many([Outcome(job.id, "w1", error="KeyError: 'x'\ndetail")], live_deck.clock())
    live_deck.store.run_now(job.id, live_deck.clock())
    live_deck.store.claim("w1", live_deck.clock(), limit=1)
    live_deck.store.complete_many([Outcome(job.id, "w1", result=1)], live_deck.clock())
    record = live_deck.store.get(job.id)
    assert record.status is State.COMPLETED and record.error
    row = rows(run("jobs"))[0]
    assert row[4] == f"{record.attempt}/{attempts_allowed(record)}" == "2/3"
    assert row[-1] == "failed before succeeding: KeyError: 'x'"
    assert re.search(r"error +failed before succeeding: KeyError: 'x'", run("show", str(job.id)).stdout)


FILTERS: list[tuple[list[str], list[str]]] = [
    (["--status", "pending"], ["due"]),
    (["--status", "scheduled"], ["later"]),
    (["--status", "dead"], ["dead"]),
    (["--queue", "reports"], ["due"]),
    (["--type", "demo.send-email"], ["later"]),
    (["--status", "pending", "--queue", "default"], []),
    (["--status", "completed"], []),
]


def test_jobs_filters(run, live_deck: Jobdeck) -> None:
    ids = {
        "due": live_deck.enqueue("demo.noop", queue="reports")[0].id,
        "later": live_deck.enqueue("demo.send-email", {"user_id": "u1"}, delay_seconds=3600)[0].id,
        "dead": make_dead(live_deck),
    }
    for args, expected in FILTERS:
        result = run("jobs", *args)
        assert result.exit_code == 0, result.output
        assert [int(r[0]) for r in rows(result)] == [ids[name] for name in reversed(ids) if name in expected], args
        assert ("no jobs" in result.stderr) == (not expected)


def test_the_status_choices_are_the_states_and_scheduled(run) -> None:
    result = run("jobs", "--help")
    listed = re.search(r"--status STATE\s+Only jobs in this state: ([a-z, \n]+)\.", result.stdout)
    assert listed is not None, result.stdout
    names = [word.rstrip(",") for word in listed.group(1).split()]
    assert names == ["pending", "scheduled", *[s.value for s in ALL_STATES[1:]]]
    assert run("jobs", "--status", "lost").exit_code == 2


def test_user_text_cannot_drive_the_terminal(run, live_deck: Jobdeck) -> None:
    """An error message is user data: an ESC sequence in it reaches the
    operator's terminal escaped, in the list and on the job page."""
    job, _ = live_deck.enqueue("demo.fail", {"note": "\x1b]0;owned\x07"}, max_retries=0)
    live_deck.store.claim("w1", live_deck.clock(), limit=1)
    live_deck.store.fail_many(
        [Outcome(job.id, "w1", error="boom \x1b[2J\rforged", traceback="T\x1b[1A")], job.created_at
    )
    for result in (run("jobs"), run("show", str(job.id), "--tracebacks")):
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stdout and "\r" not in result.stdout and "\x07" not in result.stdout
        assert "boom \\x1b[2J\\rforged" in result.stdout


def test_enqueue_of_a_demo_type_without_demo_says_it_needs_demo(run, live_deck: Jobdeck, monkeypatch) -> None:
    # A registry no earlier --demo run in this process has filled (the CLI's default one is global).
    monkeypatch.setattr("jobdeck.deck.default_registry", Registry())
    result = run("enqueue", "demo.noop")
    assert result.exit_code == 1, result.output
    assert "unknown job type 'demo.noop'" in result.output and "(the demo types need --demo)" in result.output
    assert "--demo" not in run("enqueue", "reports.noop").output
    assert "--demo" not in run("enqueue", "demo.nope", "--demo").output
    assert run("enqueue", "demo.noop", "--demo").exit_code == 0


# -- show -----------------------------------------------------------------------


def test_show_prints_the_job_and_its_attempts_with_errors(run, live_deck: Jobdeck) -> None:
    live_deck.config.backoff_base = 3600
    job, _ = live_deck.enqueue("demo.fail", {"message": "nope"}, max_retries=2, idempotency_key="k-1")
    for n, error in enumerate(("first: ValueError", "second: KeyError")):
        if n:
            live_deck.store.run_now(job.id, live_deck.clock())
        live_deck.store.claim("w1", live_deck.clock(), limit=1)
        live_deck.store.fail_many(
            [Outcome(job.id, "w1", error=error, traceback=f"Traceback\n  {error}")], live_deck.clock()
        )
    result = run("show", str(job.id))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith(f"job {job.id}\n")
    assert re.search(r"status +failed \(due \d{4}-", text)
    assert re.search(r"payload +\{\"message\": \"nope\"\}", text) and re.search(r"key +k-1", text)
    assert "attempts (2):" in text
    assert re.search(r"#1 +failed .*w1\n +first: ValueError\n +#2 +failed .*w1\n +second: KeyError", text)
    assert "Traceback" not in text
    assert "  second: KeyError" in run("show", str(job.id), "--tracebacks").stdout.split("#2")[1]


def test_show_words_priority_and_attempts_like_the_job_page(run, live_deck: Jobdeck) -> None:
    plain, _ = live_deck.enqueue("demo.noop", max_retries=3)
    urgent, _ = live_deck.enqueue("demo.noop", priority="high")
    dead = make_dead(live_deck)
    assert re.search(r"\n  priority +low \(0, the default\)\n", run("show", str(plain.id)).stdout)  # the API's word
    assert re.search(r"\n  priority +high \(\d+\)\n", run("show", str(urgent.id)).stdout)
    assert re.search(r"\n  attempts +0/4 made / allowed\n", run("show", str(plain.id)).stdout)
    assert re.search(r"\n  attempts +1/1 made / allowed\n", run("show", str(dead)).stdout)


def test_jobs_and_show_say_a_job_sent_to_dead_with_retries_left_was_not_retried(run, live_deck: Jobdeck) -> None:
    job, _ = live_deck.enqueue("demo.fail", max_retries=3)
    live_deck.store.claim("w1", live_deck.clock(), limit=1)
    error = "InvalidField: amount: must be a number\n(not retried: InvalidField is non-retryable)"
    live_deck.store.fail_many([Outcome(job.id, "w1", error=error, retryable=False)], live_deck.clock())
    [row] = rows(run("jobs"))
    assert row[4] == "1 of 4, not retried"  # not "1/4", three retries that never come
    shown = run("show", str(job.id)).stdout
    assert re.search(r"\n  attempts +1 of 4, not retried: non-retryable InvalidField\n", shown), shown


def test_show_json_is_the_apis_shape(run, live_deck: Jobdeck) -> None:
    job_id = make_dead(live_deck, payload={"n": 1})
    result = run("show", str(job_id), "--json")
    assert result.exit_code == 0, result.output
    now = live_deck.clock()
    expected = job_json(live_deck.store.get(job_id), now, live_deck.store.attempts_of(job_id))
    shown = json.loads(result.stdout)
    assert shown.pop("logs") == {"lines": 0, "url": f"/api/jobs/{job_id}/logs"}
    assert shown.pop("waiting_reason") is None  # dead: not waiting to run
    assert shown == expected
    assert shown["attempts"][0]["error"] == "boom\nsecond line"
    api = create_app(deck=live_deck, init_db=False).test_client().get(f"/api/jobs/{job_id}").get_json()
    assert set(api) == set(json.loads(result.stdout)), "the same fields as GET /api/jobs/ID"


def test_show_prints_the_unique_key_and_with_logs_the_lines(run, live_deck: Jobdeck) -> None:
    from jobdeck.jobs.joblogs import LogLimits, LogLine
    from jobdeck.store.joblogs import append_lines

    job, _ = live_deck.enqueue("demo.noop", {"order": 7}, unique={"by": ["payload.order"]})
    line = LogLine("warning", "fetched <3 pages>", live_deck.clock())
    assert append_lines(live_deck.store, job.id, 1, [line], 0, LogLimits()) == 1
    plain = run("show", str(job.id)).stdout
    assert re.search(r'\n  unique +\{"payload.order":7,"type":"demo.noop"\}\n', plain), plain
    assert "log: 1 lines (--logs shows them)" in plain
    with_logs = run("show", str(job.id), "--logs").stdout
    assert re.search(r"\n  #1 .* warning +fetched <3 pages>\n", with_logs), with_logs


def test_show_a_missing_job(run, live_deck: Jobdeck) -> None:
    result = run("show", "999")
    assert result.exit_code == 1 and "job 999 does not exist" in result.stderr


# -- retry and discard ---------------------------------------------------------------


def test_retry_and_discard_by_id_are_audit_logged_as_cli(run, live_deck: Jobdeck) -> None:
    dead = make_dead(live_deck)
    other = make_dead(live_deck)
    done, _ = live_deck.enqueue("demo.noop")
    live_deck.store.claim("w1", live_deck.clock(), limit=1, types=["demo.noop"])
    live_deck.store.complete_many([Outcome(done.id, "w1")], live_deck.clock())
    result = run("retry", str(dead), str(done.id), "999", str(dead))
    assert result.exit_code == 1
    assert result.stdout == f"job {dead} retried: now pending\n"
    assert (
        f"refused: job {done.id} is completed; only failed or dead or discarded jobs can be retried\n" in result.stderr
    )
    assert "refused: job 999 does not exist\n" in result.stderr
    assert live_deck.store.get(dead).status is State.PENDING
    result = run("discard", str(other))
    assert result.exit_code == 0 and result.stdout == f"job {other} discarded: now discarded\n"
    entries = [(a.actor, a.action, a.job_id, a.count, a.detail) for a in audit(live_deck)]
    assert entries == [
        ("cli", "retry", dead, 1, None),
        ("cli", "retry", done.id, 0, f"refused: job {done.id} is completed; only failed or dead or discarded jobs can be retried"),
        ("cli", "discard", other, 1, None),
    ]  # fmt: skip


def test_cancel_by_id_is_the_decks_cancel_audit_logged_as_cli(run, live_deck: Jobdeck) -> None:
    waiting, _ = live_deck.enqueue("demo.noop", delay_seconds=600)
    running, _ = live_deck.enqueue("demo.sleep", {"seconds": 60})
    [claimed] = live_deck.store.claim("w1", live_deck.clock(), limit=1, types=["demo.sleep"])
    assert claimed.id == running.id
    dead = make_dead(live_deck)
    result = run("cancel", str(waiting.id), str(running.id), str(dead))
    assert result.exit_code == 1
    assert (
        result.stdout == f"job {waiting.id} cancelled: now cancelled\njob {running.id} cancel requested: now running\n"
    )
    assert (
        f"refused: job {dead} is dead; only pending or running or failed or blocked jobs can be cancelled\n"
        in result.stderr
    )
    assert live_deck.store.get(waiting.id).status is State.CANCELLED
    assert live_deck.store.get(running.id).cancel_requested_at is not None
    assert [(a.actor, a.action, a.job_id, a.count) for a in audit(live_deck)] == [
        ("cli", "cancel", waiting.id, 1), ("cli", "cancel", running.id, 1), ("cli", "cancel", dead, 0),
    ]  # fmt: skip


def test_retry_all_matching_runs_in_batches_with_progress(run, live_deck: Jobdeck) -> None:
    mine = dead_jobs(live_deck, "demo.fail", BATCH + 3)
    others = dead_jobs(live_deck, "demo.noop", 2)
    result = run("retry", "--all", "--status", "dead", "--type", "demo.fail", "--yes")
    assert result.exit_code == 0, result.output
    total = BATCH + 3
    assert f"retried {BATCH} of {total}\nretried {total} of {total}\n" in result.stderr
    assert result.stdout == f"{total} jobs retried\n"
    assert {live_deck.store.get(i).status for i in mine} == {State.PENDING}
    assert {live_deck.store.get(i).status for i in others} == {State.DEAD}
    [entry] = audit(live_deck)
    assert (entry.actor, entry.action, entry.count, entry.job_id) == ("cli", "retry all", total, None)
    assert entry.detail == "all dead jobs of type demo.fail"
    assert entry.total == total and entry.finished_at is not None


def test_discard_all_asks_first_and_does_nothing_when_told_no(run, live_deck: Jobdeck) -> None:
    later = [live_deck.enqueue("demo.noop", queue="q", delay_seconds=600)[0].id for _ in range(3)]
    elsewhere, _ = live_deck.enqueue("demo.noop", delay_seconds=600)
    result = run("discard", "--all", "--status", "scheduled", "--queue", "q", input="n\n")
    assert result.exit_code == 1 and "Discard 3 scheduled jobs in queue q?" in result.output
    assert {live_deck.store.get(i).status for i in later} == {State.PENDING} and audit(live_deck) == []
    result = run("discard", "--all", "--status", "scheduled", "--queue", "q", input="y\n")
    assert result.exit_code == 0 and result.stdout.endswith("3 jobs discarded\n")
    assert {live_deck.store.get(i).status for i in later} == {State.DISCARDED}
    assert live_deck.store.get(elsewhere.id).status is State.PENDING
    assert run("discard", "--all", "--status", "scheduled", "--queue", "q", "--yes").stderr.endswith(
        "no scheduled jobs in queue q to discard\n"
    )


def test_all_matching_names_each_job_that_moved_on_and_exits_1(live_deck: Jobdeck, capsys, monkeypatch) -> None:
    """A job that leaves the matching state between the batch's read and its
    move (another operator retried it) is left alone and named."""
    ids = dead_jobs(live_deck, "demo.fail", 3)
    retry = next(a for a in cli.JOB_ACTIONS if a.name == "retry")
    assert retry.matching
    real_move = live_deck.store.retry_ids

    def someone_else_first(batch: list[int], now: Any, tally: Any) -> list[int]:
        live_deck.store.retry(ids[1], now)
        return real_move(batch, now, tally)

    monkeypatch.setattr(live_deck.store, "retry_ids", someone_else_first)
    f = cli.job_filter("dead", "demo.fail", None)
    refused = cli.act_on_matching(retry, live_deck, f, "dead jobs", yes=True)
    assert refused == 1
    err = capsys.readouterr().err
    assert f"refused: job {ids[1]} moved on meanwhile; left alone\n" in err and "retried 2 of 3" in err
    assert [(a.count, a.total) for a in audit(live_deck)] == [(2, 3)]
    (progress,) = [a.progress(live_deck.clock()) for a in audit(live_deck)]
    assert progress is not None and progress.describe() == "2 of 3; 1 had moved on"


def test_all_needs_a_status_the_action_can_move(run, live_deck: Jobdeck) -> None:
    assert "--all needs --status" in run("retry", "--all").output
    assert run("retry", "--all", "--status", "pending").exit_code == 2  # only failed, dead, discarded
    assert run("retry", "1", "--all", "--status", "dead").exit_code == 2
    assert "give job ids" in run("discard").output


@pytest.mark.parametrize(
    "args",
    [["--type", "nosuch"], ["--queue", "nosuch"], ["--status", "dead"], ["--type", ""]],
)
@pytest.mark.parametrize("command", ["retry", "discard"])
def test_filters_with_ids_are_refused_not_ignored(run, live_deck: Jobdeck, command: str, args: list[str]) -> None:
    job_id = make_dead(live_deck)
    result = run(command, str(job_id), *args)
    assert result.exit_code == 2, result.output
    assert f"{args[0]} filters --all only" in result.output
    assert live_deck.store.get(job_id).status is State.DEAD and audit(live_deck) == []


# -- hostile input ----------------------------------------------------------------


NOT_IDS = ["abc", "1.5", "0", "-1", "1e3", "²", "٣", "9" * 20, "1\x00", "", " ", "0x10", "1 2"]


@pytest.mark.parametrize("command", ["show", "retry", "discard", "cancel"])
def test_ids_that_are_not_job_ids_are_refused(run, live_deck: Jobdeck, command: str) -> None:
    job_id = make_dead(live_deck)
    for raw in NOT_IDS:
        args = [command, "--", raw] if command == "show" else [command, "--", str(job_id), raw]
        result = run(*args)
        assert result.exit_code == 2, (raw, result.output)
        assert "is not a job id" in result.output and "Traceback" not in result.output, raw
    assert live_deck.store.get(job_id).status is State.DEAD and audit(live_deck) == []


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "--type", "demo\x00fail"],
        ["jobs", "--queue", "q\x00"],
        ["retry", "--all", "--status", "dead", "--type", "demo\x00fail", "--yes"],
        ["discard", "--all", "--status", "dead", "--queue", "\x00", "--yes"],
        ["jobs", "--type", "t" * 201],
    ],
)
def test_nul_and_overlong_filters_are_refused(run, live_deck: Jobdeck, args: list[str]) -> None:
    make_dead(live_deck)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert "NUL" in result.output or "at most 200 characters" in result.output
    assert "Traceback" not in result.output and audit(live_deck) == []


# -- which database -----------------------------------------------------------------


def test_the_database_line_masks_the_password() -> None:
    assert cli.masked("postgresql+psycopg://ops:s3cret@db.internal:5432/jobs") == (
        "postgresql+psycopg://ops:***@db.internal:5432/jobs"
    )


def test_a_database_url_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    env = jobdeck_env(tmp_path)
    env["JOBDECK_DATABASE_URL"] = "sqlite"
    result = CliRunner().invoke(main, ["jobs"], env=env)
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("Error: invalid configuration: database_url: Could not parse")


@pytest.mark.backends
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_on_postgresql_the_line_names_it_without_the_password(db_url: str, tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(db_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    env = jobdeck_env(tmp_path)
    env["JOBDECK_DATABASE_URL"] = url
    result = CliRunner().invoke(main, ["jobs"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("database: postgresql+psycopg://postgres:***@")
    assert "s3cret-pw" not in result.output


def _without_a_database(cwd: Path) -> dict[str, str]:
    """The environment of an operator with no database configured: the
    default ./instance/jobdeck.db of the folder the command runs in."""
    env = jobdeck_env(cwd)
    del env["JOBDECK_DATABASE_URL"], env["JOBDECK_INSTANCE_PATH"]
    return env


def test_run_from_another_folder_jobs_makes_no_empty_database(tmp_path: Path) -> None:
    assert not (tmp_path / "jobdeck.toml").exists() and tmp_path != ROOT
    wanted = tmp_path / "instance" / "jobdeck.db"
    proc = subprocess.run(
        [sys.executable, "-m", "jobdeck.cli", "jobs"], cwd=tmp_path, env=_without_a_database(tmp_path),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"database: sqlite:///{wanted}\nError: no database at {wanted}: point JOBDECK_DATABASE_URL (or database_url"
        " in jobdeck.toml) at it, or run from its folder; --create makes a new, empty one\n"
    )
    assert not wanted.exists()


@pytest.mark.slow
def test_only_create_makes_a_new_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    wanted = tmp_path / "instance" / "jobdeck.db"
    env = _without_a_database(tmp_path)
    for args in (
        ["enqueue", "demo.noop", "--demo"],
        ["show", "1"],
        ["retry", "1"],
        ["discard", "--all", "--status", "dead"],
    ):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 1, result.output
        assert f"Error: no database at {wanted}: point JOBDECK_DATABASE_URL" in result.stderr
        assert ("--create makes a new, empty one" in result.stderr) == (args[0] == "enqueue")
        assert not wanted.exists() and result.stdout == ""
    result = CliRunner().invoke(main, ["enqueue", "demo.noop", "--demo", "--create"], env=env)
    assert result.exit_code == 0, result.output
    assert wanted.exists() and json.loads(result.stdout)["status"] == "pending"
    assert CliRunner().invoke(main, ["show", "1"], env=env).exit_code == 0


def test_a_new_job_action_is_one_entry(tmp_path: Path, live_deck: Jobdeck) -> None:
    """An entry without a batch form (as cancel will be) gets a command
    taking ids only, refusing and audit-logging like retry and discard."""
    group = click.Group("jobdeck")
    action = cli.JobAction("hurry", "hurried", Transition.RUN_NOW, cli.audited("hurry", Store.run_now))
    cli.add_job_command(action, group)
    later, _ = live_deck.enqueue("demo.noop", delay_seconds=600)
    due, _ = live_deck.enqueue("demo.noop")
    env = jobdeck_env(tmp_path)
    result = CliRunner().invoke(group, ["hurry", str(later.id), str(due.id)], env=env)
    assert result.exit_code == 1, result.output
    assert result.stdout == f"job {later.id} hurried: now pending\n"
    assert f"refused: job {due.id} is already due" in result.stderr
    assert [(a.actor, a.action, a.job_id, a.count) for a in audit(live_deck)] == [
        ("cli", "hurry", later.id, 1), ("cli", "hurry", due.id, 0)
    ]  # fmt: skip
    helped = CliRunner().invoke(group, ["hurry", "--help"], terminal_width=80).output
    assert "--all" not in helped and "Only pending or failed jobs can be hurried" in helped
    assert CliRunner().invoke(group, ["hurry", "--all"], env=env).exit_code == 2
