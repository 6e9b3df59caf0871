"""The jobdeck command, run as real processes where it matters."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from jobdeck.cli import main

from tests.conftest import wait_for

pytestmark = pytest.mark.slow  # other processes and builds: left out of the quick tier

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def jobdeck_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(
        PYTHONPATH=str(ROOT),
        JOBDECK_DATABASE_URL=f"sqlite:///{tmp_path / 'jobdeck.db'}",
        JOBDECK_INSTANCE_PATH=str(tmp_path / "instance"),
        JOBDECK_POLL_INTERVAL="0.1",
        **extra,
    )
    return env


def spawn(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobdeck.cli", *args],
        cwd=tmp_path,
        env=jobdeck_env(tmp_path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def http_json(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _up(base: str) -> bool:
    try:
        return bool(http_json(f"{base}/api/health")["ok"])
    except OSError:
        return False


def test_serve_runs_jobs_and_sigterm_releases_running_ones(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = spawn(tmp_path, "serve", "--demo", "--bind", f"127.0.0.1:{port}", JOBDECK_SHUTDOWN_GRACE="0.5")
    try:
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=20, message="server up")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        quick = http_json(f"{base}/api/jobs", {"type": "demo.noop"})
        slow = http_json(f"{base}/api/jobs", {"type": "demo.sleep", "payload": {"seconds": 60}})
        wait_for(lambda: http_json(f"{base}/api/jobs/{quick['id']}")["status"] == "completed")
        wait_for(lambda: http_json(f"{base}/api/jobs/{slow['id']}")["status"] == "running")
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # dump every thread's stack, then fail with it
            try:
                out, _ = proc.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            raise AssertionError(f"serve did not stop within 30 s after SIGTERM:\n{out}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "shutting down" in out and "released 1 running jobs" in out
    runner = CliRunner()
    env = jobdeck_env(tmp_path)
    listed = runner.invoke(main, ["jobs", "--status", "pending"], env=env)
    assert listed.exit_code == 0, listed.output
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [[str(slow["id"]), "pending"]]


def test_worker_runs_jobs_without_loading_the_web_or_alembic(tmp_path: Path) -> None:
    """``jobdeck worker`` serves nothing: it builds its deck without a Flask
    app, and a database at head is checked without Alembic, so neither is
    in its memory, nor SQLAlchemy's ORM. ``-X importtime`` lists every module the process loads,
    from start to stop."""
    env = jobdeck_env(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0  # the worker then finds it at head
    enqueued = runner.invoke(main, ["enqueue", "demo.noop", "--demo"], env=env)
    assert enqueued.exit_code == 0, enqueued.output
    job_id = json.loads(enqueued.stdout)["id"]
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "jobdeck.cli", "worker", "--demo"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def completed() -> bool:
        shown = runner.invoke(main, ["show", str(job_id)], env=env)
        return proc.poll() is not None or " completed" in shown.stdout

    try:
        wait_for(completed, timeout=30, interval=0.1, message="the worker completes the job")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-2000:]
    modules = {line.split("|")[-1].strip() for line in out.splitlines() if line.startswith("import time:")}
    loaded = {name.split(".")[0] for name in modules}
    assert "sqlalchemy" in loaded and "jobdeck" in loaded, "importtime listed the imports"
    assert not loaded & {"flask", "werkzeug", "jinja2", "alembic", "flask_wtf", "cron_descriptor"}, sorted(loaded)
    # The tables are Core tables: the ORM is about a third of SQLAlchemy's import, in every process.
    assert "sqlalchemy.orm" not in modules, sorted(m for m in modules if m.startswith("sqlalchemy.orm"))


def test_enqueue_jobs_and_init_db_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    env = jobdeck_env(tmp_path)
    assert "database ready" in runner.invoke(main, ["init-db"], env=env).output
    r = runner.invoke(main, ["enqueue", "demo.send-email", "--payload", '{"user_id": "u1"}', "--demo",
                             "--priority", "high", "--key", "welcome-u1"], env=env)  # fmt: skip
    assert r.exit_code == 0, r.output
    job = json.loads(r.output[r.output.index("{") : r.output.rindex("}") + 1])
    assert job["priority_label"] == "high" and job["status"] == "pending"
    again = runner.invoke(main, ["enqueue", "demo.send-email", "--payload", '{"user_id": "u1"}', "--demo",
                                 "--key", "welcome-u1"], env=env)  # fmt: skip
    assert again.exit_code == 0 and "already existed" in again.output
    listed = runner.invoke(main, ["jobs"], env=env)
    assert listed.output.count("demo.send-email") == 1
    bad = runner.invoke(main, ["enqueue", "demo.nope", "--demo"], env=env)
    assert bad.exit_code != 0 and "unknown job type 'demo.nope'" in bad.output
    bad = runner.invoke(main, ["enqueue", "demo.noop", "--payload", "[1]", "--demo"], env=env)
    assert bad.exit_code != 0 and "must be a JSON object" in bad.output
    bad = runner.invoke(main, ["jobs", "--status", "lost"], env=env)
    assert bad.exit_code != 0


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["serve", "--bind", "0.0.0.0:8123"], {}, "refusing to listen on 0.0.0.0:8123"),
        (["serve"], {"JOBDECK_WORKERS": "-2"}, "invalid configuration: workers: must be >= 0, got -2"),
        (["worker"], {"JOBDECK_HANDLER_MODULES": "no.such.module"}, "handler_modules: cannot import 'no.such.module'"),
    ],
)
def test_refuses_to_start(tmp_path: Path, args, env, message) -> None:
    proc = spawn(tmp_path, *args, **env)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert message in out


def test_serve_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn(tmp_path, "serve", "--bind", f"127.0.0.1:{port}")
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert f"Error: bind: cannot listen on 127.0.0.1:{port}" in out
    assert "Traceback" not in out


def test_handler_modules_are_found_in_the_current_folder(tmp_path: Path) -> None:
    """The README's ``handler_modules = ["myapp.jobs"]`` next to the config,
    with the command run from that folder and nothing on PYTHONPATH for it."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(
        'from jobdeck.jobs.handlers import handler\n\n\n@handler("my.hello")\ndef hello(payload, ctx):\n    return "hi"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from jobdeck.cli import main; sys.exit(main())", "jobs", "--create"],
        cwd=tmp_path,
        env=jobdeck_env(tmp_path, JOBDECK_HANDLER_MODULES="myapp.jobs", PYTHONSAFEPATH="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cannot import" not in proc.stdout + proc.stderr


def test_db_revision_refuses_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobdeck.store import migrate

    installed = tmp_path / "site-packages" / "jobdeck" / "store" / "migrations"
    installed.mkdir(parents=True)
    monkeypatch.setattr(migrate, "SCRIPT_LOCATION", str(installed))
    r = CliRunner().invoke(main, ["db", "revision", "-m", "t", "--empty"], env=jobdeck_env(tmp_path))
    assert r.exit_code == 1
    assert "writes into a source checkout" in r.output
    assert not list(installed.rglob("*.py"))


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


@pytest.mark.parametrize("path", _commands(main), ids=lambda p: " ".join(p) or "jobdeck")
def test_help_fits_80_columns_and_no_summary_is_cut(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    cut = [line for line in r.output.splitlines() if line.endswith("...") and not line.startswith("Usage:")]
    assert not cut, r.output
    assert "``" not in r.output, r.output  # docstring markup, not help text
    assert all(len(line) <= 80 for line in r.output.splitlines()), r.output


def test_db_revision_is_marked_as_a_developer_command() -> None:
    listed = CliRunner().invoke(main, ["db", "--help"], terminal_width=80).output
    assert re.search(r"^  revision +\[developer\] ", listed, re.MULTILINE), listed
    assert "developers" in CliRunner().invoke(main, ["db", "revision", "--help"]).output


@pytest.mark.parametrize(
    ("argv", "program"),
    [(["-m", "worker"], True), (["/venv/bin/jobdeck", "worker"], True), (["/venv/bin/pytest"], False), ([], False)],
)
def test_only_the_program_freezes_its_imports(monkeypatch: pytest.MonkeyPatch, argv: list[str], program: bool) -> None:
    """``python -m jobdeck.cli`` and the console script collect nothing
    while they import and freeze what they imported (jobdeck.core.startup);
    a process that imports the commands (this one) keeps its collector as it was."""
    import gc

    from jobdeck.cli import _starts_the_program
    from jobdeck.core.startup import frozen_imports

    monkeypatch.setattr(sys, "argv", argv)
    assert _starts_the_program() is program
    frozen = gc.get_freeze_count()
    try:
        with frozen_imports(program):
            assert gc.isenabled() is not program
            made = [[] for _ in range(100)]
        assert gc.isenabled()
        assert (gc.get_freeze_count() >= frozen + len(made)) is program
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
