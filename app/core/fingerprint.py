"""An error's fingerprint: what stays the same when the same failure hits
different jobs, so the dashboard can group a dead letter queue by cause.

``KeyError: 'user_42'`` and ``KeyError: 'user_77'`` are one failure; so are
``RuntimeError: card 4242 declined`` and ``RuntimeError: card 1111 declined``.
The fingerprint keeps the exception class as it is and masks, in the first
line of the message, what varies per job: quoted values, UUIDs, hex ids and
every run of digits become ``?``.

Every pattern here is linear in its input: no pattern has a quantified part
followed by another that can match the same characters (the classic
catastrophic backtracking), a quoted value ends at the first closing quote,
and words are looked at one at a time in Python. The input is cut before
masking anyway: a megabyte message costs no more than its first few
kilobytes.

The fingerprint is stored on the job when it fails (``jobs.error_fingerprint``,
set by ``jobdeck.store.attempt_statements.fail``) and computed from the text the store
keeps (``jobdeck.store.faults.storable_text``), so a backfill from the ``error``
column (migration 0012) gives what the fail statement gave.
"""

from __future__ import annotations

import hashlib
import re

MAX_CHARS = 200
"""The longest fingerprint (the column is 255 wide). A longer one keeps its
start and ends in a digest of the whole, so two long messages that differ
after the cut are still two groups."""
_READ_CHARS = 4 * MAX_CHARS
"""How much of the first line is masked (masking only shortens it)."""
NO_MESSAGE = "(no message)"
"""The fingerprint of a failure recorded without any message."""
MASK = "?"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_SPACES = re.compile(r"\s+")
_QUOTED = re.compile(r"""(?<![\w'])'[^'\n]*'|(?<![\w"])"[^"\n]*\"""")
"""A quoted value; an apostrophe inside a word (``can't``) opens none."""
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")
_HEX = frozenset("0123456789abcdefABCDEF")


def fingerprint(error: str | None) -> str:
    """The group an error belongs to: its class, and its first line with the
    values that differ per job masked."""
    line = _first_line(error or "")
    if not line:
        return NO_MESSAGE
    head, sep, message = line.partition(": ")
    if sep and _is_class_name(head):
        return _bounded(f"{head}: {mask(message)}")
    return _bounded(mask(line))


def mask(message: str) -> str:
    """``message`` with quoted values, UUIDs, hex ids and numbers as ``?``."""
    text = _QUOTED.sub(lambda m: m.group(0)[0] + MASK + m.group(0)[0], message)
    text = _UUID.sub(MASK, text)
    text = _WORD.sub(_mask_word, text)
    return _SPACES.sub(" ", text).strip()


def _first_line(error: str) -> str:
    """The first non-blank line, control characters (NUL among them) as spaces."""
    text = error.lstrip()[: _READ_CHARS * 2]
    line = text.split("\n", 1)[0][:_READ_CHARS]
    return _SPACES.sub(" ", _CONTROL.sub(" ", line)).strip()


def _is_class_name(head: str) -> bool:
    """``KeyError`` or ``jobdeck.core.errors.InvalidField``: dotted identifiers."""
    return len(head) <= 120 and all(part.isidentifier() for part in head.split("."))


def _mask_word(match: re.Match[str]) -> str:
    """One word: a hex id (with a digit, or 8+ hex letters like ``deadbeef``,
    or ``0x…``) is masked whole; in any other word each run of digits is
    (``user_42`` -> ``user_?``)."""
    word = match.group(0)
    if word[:2] in ("0x", "0X") and len(word) > 2 and set(word[2:]) <= _HEX:
        return MASK
    if set(word) <= _HEX and (len(word) >= 8 or any(c.isdigit() for c in word)):
        return MASK
    return _DIGITS.sub(MASK, word)


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "backslashreplace"), digest_size=6).hexdigest()
    return f"{text[: MAX_CHARS - len(digest) - 2]}… {digest}"
