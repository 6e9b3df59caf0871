"""``jobdeck enqueue --file`` on both databases: the jobs of a JSON Lines file
(or stdin) enqueued as ``POST /api/jobs/bulk`` enqueues them, all or none,
an error naming the line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from jobdeck.cli import main
from jobdeck.deck import Jobdeck

pytestmark = pytest.mark.backends


@pytest.fixture
def enqueue_file(tmp_path: Path, db_url: str) -> Any:
    """``jobdeck enqueue --file PATH --demo`` on the test's database: ``lines``
    written to a file (``stdin`` given: ``--file -``), ``env`` added."""

    def run(lines: list[str] | None = None, *args: str, stdin: str | None = None, **env: str) -> Result:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        environ.update(JOBDECK_DATABASE_URL=db_url, JOBDECK_INSTANCE_PATH=str(tmp_path / "instance"), **env)
        target = "-"
        if lines is not None:
            path = tmp_path / "jobs.jsonl"
            path.write_bytes("".join(lines).encode())
            target = str(path)
        return CliRunner().invoke(main, ["enqueue", "--file", target, "--demo", *args], env=environ, input=stdin)

    return run


def answers(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def total(deck: Jobdeck) -> int:
    return sum(deck.store.counts(deck.clock()).values())


def line(**job: Any) -> str:
    return json.dumps(job) + "\n"


def test_the_jobs_of_a_file_are_enqueued_in_order_each_as_one(enqueue_file: Any, deck: Jobdeck) -> None:
    old = deck.enqueue("demo.noop", {"o": 1}, idempotency_key="o-1").job.id
    result = enqueue_file(
        [
            line(type="demo.noop", payload={"n": 1}, priority="high"),
            "\n",
            line(type="demo.noop", payload={"o": 1}, idempotency_key="o-1").replace("\n", "\r\n"),
            line(type="demo.noop", payload={"o": 2}, idempotency_key="o-2"),
            line(type="demo.noop", payload={"o": 2}, idempotency_key="o-2"),
            "   \n",
            line(type="demo.noop", payload={"u": 1}, unique=True),
            line(type="demo.noop", payload={"u": 1}, unique=True),
            line(type="demo.send-email", payload={"user_id": "u\u0000"}, queue="mail"),
        ]
    )
    got = answers(result)
    assert [(a["created"], a["duplicate"]) for a in got] == [
        (True, False), (False, False), (True, False), (False, False), (True, False), (False, True), (True, False),
    ]  # fmt: skip
    assert got[1]["id"] == old and got[3]["id"] == got[2]["id"] and got[5]["id"] == got[4]["id"]
    assert "enqueued 4 of 7 jobs; 3 already there (by key or unique key)" in result.stderr
    first, email = deck.store.get(got[0]["id"]), deck.store.get(got[6]["id"])
    assert (first.payload, first.priority) == ({"n": 1}, 20)
    assert (email.payload, email.queue) == ({"user_id": "u\u0000"}, "mail"), "a NUL in a payload is kept, as by the API"
    assert total(deck) == 5


def test_stdin_is_read_with_a_dash(enqueue_file: Any, deck: Jobdeck) -> None:
    got = answers(enqueue_file(None, stdin=line(type="demo.noop") + line(type="demo.report")))
    assert [deck.store.get(a["id"]).type for a in got] == ["demo.noop", "demo.report"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (line(type="demo.noop", payload=[1]), "line 4: payload: must be a JSON object"),
        (line(type="demo.noop", colour="red"), "line 4: colour: unknown field"),
        (line(type="demo.nope"), "line 4: type: unknown job type 'demo.nope'"),
        (line(type="demo.noop", queue="a\u0000"), "line 4: queue:"),
        ("[1]\n", "line 4: expected a JSON object"),
        ('{"type": "demo.noop"\n', "line 4: not valid JSON"),
        ('{"type": "demo.noop", "payload": {"x": NaN}}\n', "line 4: payload.x: numbers must be finite"),
        (line(type="demo.noop", payload={"other": 1}, idempotency_key="k"), "line 4: idempotency_key: "),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_enqueued(enqueue_file: Any, deck: Jobdeck, bad: str, message: str) -> None:
    result = enqueue_file([line(type="demo.noop", idempotency_key="k"), "\n", line(type="demo.noop"), bad])
    assert result.exit_code == 1
    assert message in result.stderr and result.stderr.rstrip().endswith("nothing was enqueued"), result.stderr
    assert result.stdout == "" and total(deck) == 0


def test_the_count_and_each_line_are_bounded(enqueue_file: Any, deck: Jobdeck) -> None:
    three = [line(type="demo.noop")] * 3
    result = enqueue_file(three, JOBDECK_MAX_BULK_JOBS="2")
    assert result.exit_code == 1 and "line 3: more than 2 jobs in the file (max_bulk_jobs)" in result.stderr
    assert answers(enqueue_file(three[:2], JOBDECK_MAX_BULK_JOBS="2"))

    cap = 3 * 1000 + 64 * 1024
    long_line = line(type="demo.noop", payload={"s": "x" * cap})
    result = enqueue_file([line(type="demo.noop"), long_line], JOBDECK_MAX_PAYLOAD_BYTES="1000")
    assert result.exit_code == 1 and f"line 2: longer than {cap} bytes" in result.stderr
    big = line(type="demo.noop", payload={"s": "x" * 1001})
    result = enqueue_file([big], JOBDECK_MAX_PAYLOAD_BYTES="1000")
    assert result.exit_code == 1 and "line 1: payload: payload is 1009 bytes; the limit is 1000 bytes" in result.stderr
    assert total(deck) == 2

    empty = enqueue_file(["\n", "  \n"])
    assert empty.exit_code == 1 and "no jobs in the file" in empty.stderr


def test_file_and_the_single_jobs_options_exclude_each_other(enqueue_file: Any, deck: Jobdeck) -> None:
    result = enqueue_file([line(type="demo.noop")], "--key", "k", "--priority", "high")
    assert result.exit_code == 2 and "leave out --priority, --key" in result.output
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    neither = CliRunner().invoke(main, ["enqueue", "--demo"], env=environ)
    assert neither.exit_code == 2 and "give a job TYPE, or --file" in neither.output
    assert total(deck) == 0
