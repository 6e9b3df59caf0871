"""The error fingerprint: the same failure on different jobs is one group,
different failures are different groups, and no input is slow or unsafe."""

from __future__ import annotations

import time

import pytest
from jobdeck.core.fingerprint import MAX_CHARS, NO_MESSAGE, fingerprint
from jobdeck.store.faults import storable_text


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("KeyError: 'user_42'", "KeyError: 'user_77'"),
        ("RuntimeError: card 4242 declined", "RuntimeError: card 1111 declined"),
        ('ValueError: bad value "abc" for field x', 'ValueError: bad value "zzz" for field x'),
        ("LookupError: order 3f2a9c1e not found", "LookupError: order 9b8c7d6e not found"),
        (
            "NotFound: job 123e4567-e89b-12d3-a456-426614174000 gone",
            "NotFound: job 00000000-ffff-abcd-abcd-0123456789ab gone",
        ),
        ("OSError: at 0xdeadbeef", "OSError: at 0x7f3e00a1"),
        ("TimeoutError: after 30.5 s", "TimeoutError: after 2.25 s"),
        (
            "stalled: worker h1:412:a3f9c2 stopped at 2026-01-01T12:00:00",
            "stalled: worker h2:9:0b1c2d stopped at 2027-02-03T04:05:06",
        ),
        ("RuntimeError: boom\nTraceback line 1", "RuntimeError: boom\nother detail 2"),
        ("RuntimeError:   spaced\tout", "RuntimeError: spaced out"),
    ],
)
def test_what_varies_per_job_is_masked(a, b):
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("KeyError: 'user_42'", "IndexError: 'user_42'"),
        ("RuntimeError: card 4242 declined", "RuntimeError: card 4242 expired"),
        ("RuntimeError: can't connect to db", "RuntimeError: can't connect to cache"),
    ],
)
def test_different_failures_stay_apart(a, b):
    assert fingerprint(a) != fingerprint(b)


def test_the_class_is_kept_as_written_and_the_message_masked():
    assert fingerprint("KeyError: 'user_42'") == "KeyError: '?'"
    assert fingerprint("RuntimeError: card 4242 declined") == "RuntimeError: card ? declined"
    assert (
        fingerprint("jobdeck.core.errors.HTTP404Error: user_7 at row 12")
        == "jobdeck.core.errors.HTTP404Error: user_? at row ?"
    )
    assert fingerprint("RuntimeError") == "RuntimeError"
    assert fingerprint("it broke at step 3") == "it broke at step ?"
    # An apostrophe inside a word opens no quoted value.
    assert fingerprint("RuntimeError: can't find 'x'") == "RuntimeError: can't find '?'"


@pytest.mark.parametrize("empty", [None, "", "   ", "\n\n", "\x00"])
def test_no_message_is_one_group(empty):
    assert fingerprint(empty) == NO_MESSAGE


def test_nul_bytes_and_control_characters_never_reach_the_column():
    fp = fingerprint("RuntimeError: a\x00b\x01c\x7fd 12")
    assert "\x00" not in fp and "\x01" not in fp and "\x7f" not in fp
    assert fp == "RuntimeError: a b c d ?"
    # What the store keeps of a NUL (storable_text) fingerprints the same every time.
    assert fingerprint(storable_text("KeyError: 'a\x00'")) == "KeyError: '?'"


def test_unicode_is_kept_and_foreign_digits_masked():
    assert fingerprint("ValueError: naïve Größe ١٢٣ 日本 42") == "ValueError: naïve Größe ? 日本 ?"
    assert fingerprint("ValueError: emoji 🎉 7") == "ValueError: emoji 🎉 ?"
    # A lone surrogate as the store keeps it (backslash-escaped) is plain text.
    fp = fingerprint(storable_text("ValueError: bad \udcff byte"))
    fp.encode("utf-8")


def test_a_long_fingerprint_is_bounded_but_stays_distinct():
    a = "RuntimeError: " + "word " * 100 + "alpha"
    b = "RuntimeError: " + "word " * 100 + "omega"
    fa, fb = fingerprint(a), fingerprint(b)
    assert len(fa) <= MAX_CHARS and len(fb) <= MAX_CHARS
    assert fa != fb and fa.startswith("RuntimeError: word word")
    assert fingerprint(a) == fa  # stable


@pytest.mark.parametrize(
    "hostile",
    [
        "RuntimeError: " + "x" * 1_000_000,
        "RuntimeError: " + "'" * 1_000_000,
        "RuntimeError: " + "'a" * 500_000,
        "RuntimeError: " + " '" * 500_000,
        'RuntimeError: "' + "a" * 1_000_000,
        "RuntimeError: " + "1" * 1_000_000 + "g",
        "RuntimeError: " + "0x" * 500_000,
        "RuntimeError: " + "a-" * 500_000,
        "RuntimeError: " + "\x00" * 1_000_000,
        ":" * 1_000_000,
        "." * 1_000_000 + ": x",
        "\n" * 1_000_000 + "KeyError: 'x'",
        " " * 1_000_000,
    ],
    ids=lambda s: repr(s[:20]),
)
def test_a_megabyte_of_hostile_text_is_quick(hostile):
    # CPU time of this thread: a busy machine stretches the wall clock, not this.
    start = time.thread_time()
    fp = fingerprint(hostile)
    assert time.thread_time() - start < 0.2
    assert len(fp) <= MAX_CHARS and "\x00" not in fp


@pytest.mark.parametrize(
    "pattern",
    ["'" * 2, "'a", " '", "1", "0x", "a-", "ab", "deadbeef-", '"a ', "1a-"],
)
def test_the_masking_itself_is_linear(pattern):
    """Masking alone (past the cut that ``fingerprint`` makes): twice the
    input takes about twice the time, never sixteen times."""
    from jobdeck.core.fingerprint import mask

    def cost(n: int) -> float:
        text = "g" + pattern * n  # "g": a word of digits after it is no hex id
        start = time.thread_time()  # CPU time: other processes on the machine do not count
        mask(text)
        return time.thread_time() - start

    small, large = min(cost(10_000) for _ in range(3)), min(cost(40_000) for _ in range(3))
    # Linear is about 4 times, quadratic 16 (a backtracking pattern: seconds);
    # the margin is for caches and the clock's resolution.
    assert large < small * 10 + 0.01, (small, large)
