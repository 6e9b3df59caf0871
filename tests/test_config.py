"""Configuration: file, environment, and refusals that name the key."""

from __future__ import annotations

import pytest
from jobdeck.core.config import ConfigError, load


def test_defaults() -> None:
    cfg = load(path=None, env={})
    assert cfg.bind == "127.0.0.1:8000" and cfg.workers == 4 and cfg.sqlite_synchronous == "FULL"
    assert cfg.resolved_database_url().endswith("/instance/jobdeck.db")


def test_file_then_environment(tmp_path) -> None:
    path = tmp_path / "jobdeck.toml"
    path.write_text('workers = 2\nexternal_types = ["pdf.render"]\nsqlite_synchronous = "normal"\n')
    cfg = load(path=path, env={"JOBDECK_WORKERS": "0", "JOBDECK_BIND": "0.0.0.0:9000"})
    assert cfg.workers == 0 and cfg.external_types == ["pdf.render"] and cfg.sqlite_synchronous == "NORMAL"
    assert cfg.bind == "0.0.0.0:9000" and not cfg.is_loopback
    assert load(path=None, env={"JOBDECK_CONFIG": str(path)}).workers == 2


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("workers = -1", {}, "workers: must be >= 0, got -1"),
        ('workers = "four"', {}, "workers: expected an integer, got 'four'"),
        ("", {"JOBDECK_WORKERS": "many"}, "JOBDECK_WORKERS: expected an integer, got 'many'"),
        ('bind = "localhost"', {}, "bind: expected HOST:PORT, got 'localhost'"),
        ('sqlite_synchronous = "OFF"', {}, "sqlite_synchronous: must be FULL or NORMAL, got 'OFF'"),
        ("colour = 1", {}, "colour: unknown configuration key"),
        ('database_url = "mysql://x"', {}, "database_url: only sqlite:// and postgresql+psycopg:// are supported"),
        ("stall_timeout = 3", {}, "stall_timeout: must be at least twice heartbeat_interval"),
        ("workers = [", {}, "is not valid TOML"),
        ("", {"JOBDECK_DEMO": "maybe"}, "JOBDECK_DEMO: expected true or false"),
    ],
)
def test_invalid_values_name_the_key(tmp_path, text, env, message) -> None:
    path = tmp_path / "jobdeck.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path=path, env=env)
    assert message in str(info.value)


def test_missing_file_is_an_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(path=tmp_path / "nope.toml", env={})


def test_a_types_table_naming_no_known_type_is_warned_about_at_start(make_deck, caplog) -> None:
    """[types."demo.nop"] (a typo) would silently never apply: said at start-up."""
    with caplog.at_level("WARNING", logger="jobdeck"):
        make_deck(types={"demo.nop": {"max_snoozes": 3}, "demo.noop": {"concurrency": 2}})
    warned = [r.getMessage() for r in caplog.records if r.name == "jobdeck" and "[types." in r.getMessage()]
    assert len(warned) == 1 and '[types."demo.nop"]' in warned[0] and "demo.noop" in warned[0], warned


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[types."demo.noop"]\ntimeout = 30\n', "types.demo.noop: unknown key 'timeout'"),
        ("[queues.mail]\nconcurency = 2\n", "queues.mail: unknown key 'concurency' (known: concurrency, "),
        ("[queues.mail]\nunique = true\n", "queues.mail: unknown key 'unique'"),
    ],
)
def test_an_option_no_part_reads_is_refused_not_ignored(tmp_path, text, message) -> None:
    """``timeout = 30`` under ``[types."T"]`` was accepted and did nothing: the job ran without one."""
    path = tmp_path / "jobdeck.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path=path, env={})
    assert message in str(info.value)
    if "timeout" in text:
        assert "@handler(timeout=...)" in str(info.value)


def test_the_option_lists_are_what_the_code_reads() -> None:
    """The refusal above names every key some part reads, and only those."""
    from jobdeck.core.config_tables import QUEUE_OPTIONS, TYPE_OPTIONS

    from tests.test_docs_reference import _option_reads

    assert _option_reads() == (set(QUEUE_OPTIONS), set(TYPE_OPTIONS))
