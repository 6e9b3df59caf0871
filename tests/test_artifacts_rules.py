"""The rules an artifact follows before it is stored (``jobdeck.jobs.artifacts``) and
the ``[artifacts]`` config table: sizes in bytes or with a unit, refused
with a message naming the key; content types from the name."""

from __future__ import annotations

import pytest
from jobdeck.core.config import ConfigError, artifact_max_bytes, load
from jobdeck.jobs.artifacts import check_content_type, check_name, default_content_type, human_bytes


def _limit(table: object) -> int:
    return artifact_max_bytes(load(path=None, env={}, overrides={"artifacts": table}))


def test_max_bytes_defaults_to_ten_mib_and_takes_bytes_or_sizes(tmp_path):
    assert artifact_max_bytes(load(path=None, env={})) == 10 * 1024 * 1024
    assert _limit({"max_bytes": 5000}) == 5000
    assert _limit({"max_bytes": "10 MiB"}) == 10 * 1024 * 1024
    assert _limit({"max_bytes": "1.5KiB"}) == 1536
    assert _limit({"max_bytes": "2 MB"}) == 2_000_000
    toml = tmp_path / "jobdeck.toml"
    toml.write_text('[artifacts]\nmax_bytes = "64 KiB"\n')
    assert artifact_max_bytes(load(path=toml, env={})) == 65536


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"max_bytes": 0}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": -1}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": True}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": "ten"}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": "10 parsecs"}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": 1.5}, "artifacts.max_bytes: expected a positive number"),
        ({"max_bytes": "2 GiB"}, "artifacts.max_bytes: at most 1 GiB"),
        ({"max_size": 10}, "artifacts.max_size: unknown key"),
        ("10 MiB", "artifacts: expected a table"),
    ],
)
def test_bad_limits_refuse_to_start_naming_the_key(table, message):
    with pytest.raises(ConfigError, match=message):
        load(path=None, env={}, overrides={"artifacts": table})


def test_content_types_come_from_the_name_and_text_says_utf8():
    assert default_content_type("a.csv", text=True) == "text/csv; charset=utf-8"
    assert default_content_type("a.csv", text=False) == "text/csv"
    assert default_content_type("a.pdf", text=False) == "application/pdf"
    assert default_content_type("a.json", text=True) == "application/json"
    assert default_content_type("noext", text=True) == "text/plain; charset=utf-8"
    assert default_content_type("noext", text=False) == "application/octet-stream"
    assert (
        check_content_type('text/csv; charset=utf-8; header="present"') == 'text/csv; charset=utf-8; header="present"'
    )


def test_names_people_use_pass():
    for name in ["sales.csv", "Q4 report (final).xlsx", "résumé.pdf", "日本語.txt", ".hidden", "a" * 255]:
        assert check_name(name) == name


def test_sizes_read_like_people_write_them():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 10 * 1024**2, 3 * 1024**3)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "10.0 MiB", "3.0 GiB",
    ]  # fmt: skip
