"""What untrusted input must satisfy before it reaches the store.

Each rule is written once here and used by the API, the dashboard and
``Jobdeck.new_job``, because every one of them was once a 500:

- JSON values are at most ``MAX_JSON_DEPTH`` deep (the parser and the encoder
  recurse: 10,000 levels was a ``RecursionError``), hold only finite numbers
  (``NaN`` and ``Infinity`` were stored and sent back as invalid JSON), and
  only valid Unicode (a lone surrogate such as ``"\\ud800"`` decodes in Python
  but cannot be written to either database).
- Text bound for a text column holds no NUL (PostgreSQL refuses it with a
  ``DataError``) and is of bounded length.
- Integers are ASCII digits (``"²".isdigit()`` is true, ``int("²")`` fails)
  that fit the databases' BIGINT (SQLite raises ``OverflowError`` past it).
- Names people read and match (queue and type names, workflow and artifact
  names) hold no character that cannot be seen (``hidden_character``): seven
  queues that all read "billing" were once listed, and pausing one left the
  others running. Queue and type names are also NFC-normalized (``name``),
  so a name typed on a keyboard that composes accents differently is the
  same queue. Idempotency keys are not names: they stay exact bytes.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

from jobdeck.core.errors import InvalidField, ResultTooLarge
from jobdeck.core.states import PRIORITY_LABELS

MAX_TYPE_CHARS = 200
MAX_QUEUE_CHARS = 100

INT64_MAX = 2**63 - 1
"""The largest id, cursor or priority the databases' BIGINT can hold."""

MAX_JSON_DEPTH = 64
"""Nesting allowed in a request body (the body itself is level 1). A payload
holds IDs, not snapshots; 64 levels is far past any real one."""

MAX_SEARCH_CHARS = 200
"""A search term's length: SQLite refuses LIKE patterns over 50,000 bytes,
and no one searches jobs with a paragraph."""

_INTEGER = re.compile(r"-?[0-9]{1,19}")


def loads(text: str | bytes, field: str = "", depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text and apply ``check_json`` (``depth``: the nesting
    allowed). Raises ``json.JSONDecodeError`` (a ``ValueError``) when the
    text is not JSON, for the caller to word, and ``InvalidField`` when it
    is JSON this service does not accept."""
    try:
        value = json.loads(text, parse_int=_parse_json_int)
    except RecursionError:
        raise InvalidField(field or "body", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except _IntTooLong:
        raise InvalidField(field or "body", f"holds an integer of more than {MAX_JSON_INT_DIGITS} digits") from None
    check_json(value, field, depth)
    return value


MAX_JSON_INT_DIGITS = 100
"""Digits of a JSON integer: Python refuses past 4,300 with a bare
``ValueError`` (and converting long ones is quadratic); no id or amount
needs more than this."""


class _IntTooLong(Exception):
    """Not a ValueError: callers read a ValueError from ``loads`` as "not JSON"."""


def _parse_json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _IntTooLong
    return int(text)


def check_json(value: Any, field: str = "", depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a JSON value nested deeper than ``MAX_JSON_DEPTH`` levels,
    holding a non-finite number, or a string (or key) that is not valid
    Unicode. The error names where: ``payload.items[3].price``; with
    ``field`` empty (a whole request body) the top-level key alone.
    ``depth`` counts the levels of a wrapper too: a bulk enqueue's body holds
    each job two levels down, and each job is held to ``MAX_JSON_DEPTH``.

    Iterative, so a deep value from a Python caller cannot exhaust the stack
    here either; a path is built only for containers, and scalars are checked
    in their parent's loop."""
    if not isinstance(value, dict | list):
        _check_scalar(value, field or "body")
        return
    stack: list[tuple[Any, int, str]] = [(value, 1, field)]
    while stack:
        item, level, where = stack.pop()
        if level > depth:
            raise InvalidField(_shown(where), f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidField(where or "body", f"object keys must be strings, got {key!r}")
                _check_unicode(key, where or "body")
                path = f"{where}.{key}" if where else key
                if isinstance(child, dict | list):
                    stack.append((child, level + 1, path))
                else:
                    _check_scalar(child, path)
        else:
            for index, child in enumerate(item):
                path = f"{where or 'body'}[{index}]"
                if isinstance(child, dict | list):
                    stack.append((child, level + 1, path))
                else:
                    _check_scalar(child, path)


def _check_scalar(value: Any, where: str) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidField(_shown(where), "numbers must be finite (no NaN or Infinity)")
    elif isinstance(value, str):
        _check_unicode(value, where)


def _shown(where: str) -> str:
    """A field path as an error names it: long ones cut short."""
    return where if len(where) <= 80 else where[:80] + "…"


def _check_unicode(text: str, field: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidField(_shown(field), "not valid Unicode (a lone surrogate escape)") from None


def check_text(value: str, field: str, max_length: int) -> str:
    """A string for a text column: at most ``max_length`` characters, no NUL,
    valid Unicode. Returns it, so a caller can validate and assign at once."""
    if len(value) > max_length:
        raise InvalidField(field, f"at most {max_length} characters")
    if "\x00" in value:
        raise InvalidField(field, "must not contain NUL characters")
    _check_unicode(value, field)
    return value


_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
"""Control, format (bidi controls, zero-width characters, the BOM), surrogate,
private-use and unassigned characters, and line, paragraph and space
separators (the plain space, U+0020, is allowed)."""
_HIDDEN_OTHERS = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2800, 0x3164, 0xFFA0]
    + list(range(0xFE00, 0xFE10))
    + list(range(0xE0100, 0xE01F0))
)
"""Invisible characters of other categories: Unicode's default-ignorable
marks and fillers (combining grapheme joiner, Hangul fillers, Khmer inherent
vowels, Mongolian and other variation selectors) and the braille blank."""


def hidden_character(text: str) -> tuple[int, str] | None:
    """The first character of ``text`` that cannot be seen, or reads as
    another (a non-breaking space for a space), as (position from 1, the
    character); None when there is none. The one check behind every name a
    person reads: queue and type names (``name``), workflow names and
    artifact names."""
    if text.isascii():
        for i, c in enumerate(text, 1):
            if c < " " or c == "\x7f":
                return i, c
        return None
    for i, c in enumerate(text, 1):
        if c == " ":
            continue
        if unicodedata.category(c) in _HIDDEN_CATEGORIES or ord(c) in _HIDDEN_OTHERS:
            return i, c
    return None


def character_name(c: str) -> str:
    """``U+200B ZERO WIDTH SPACE``: a character as a message names it."""
    name = unicodedata.name(c, "")
    return f"U+{ord(c):04X} {name}" if name else f"U+{ord(c):04X}"


def hidden_problem(text: str) -> str | None:
    """What ``hidden_character`` found, in words, or None."""
    found = hidden_character(text)
    if found is None:
        return None
    position, c = found
    return (
        f"{character_name(c)} at position {position}: no control characters, nor format, bidi, "
        "zero-width or other invisible ones"
    )


def check_name(value: Any, field: str, max_length: int) -> str:
    """A queue or job type name: a non-empty string of at most ``max_length``
    characters, NFC-normalized (a decomposed "é" is the same queue as a
    composed one), with no hidden character, no leading or trailing space,
    and no lookalike (``lookalike_problem``). ``InvalidField`` names the
    character and its position. Returns the normalized name."""
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise InvalidField(field, f"must be a non-empty string of at most {max_length} characters")
    _check_unicode(value, field)
    normal = value if value.isascii() else unicodedata.normalize("NFC", value)
    if len(normal) > max_length:  # NFC lengthens some ("\u0958" is two characters once normalized)
        raise InvalidField(field, f"must be a non-empty string of at most {max_length} characters once NFC-normalized")
    problem = hidden_problem(normal)
    if problem is not None:
        raise InvalidField(field, problem)
    if normal != normal.strip():
        raise InvalidField(field, "no leading or trailing spaces")
    problem = lookalike_problem(normal)
    if problem is not None:
        raise InvalidField(field, problem)
    return normal


_CONFUSABLE_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK")
"""Scripts whose letters read alike ("а" is Cyrillic, "ο" Greek): a name may use one of them, not several."""


def lookalike_problem(text: str) -> str | None:
    """A visible character that makes ``text`` read as another name: a
    compatibility form of a letter or digit (fullwidth "ｂ", the ligature
    "ﬁ", a superscript "²"), or letters of Latin, Cyrillic and Greek mixed
    (a Cyrillic "і" in "bіlling"). None when there is none."""
    if text.isascii():
        return None
    scripts: dict[str, tuple[int, str]] = {}
    for i, c in enumerate(text, 1):
        if c.isascii():
            if c.isalpha():
                scripts.setdefault("LATIN", (i, c))
            continue
        category = unicodedata.category(c)
        if category[0] in "LN" and unicodedata.normalize("NFKC", c) != c:
            plain = unicodedata.normalize("NFKC", c)
            return f"{character_name(c)} at position {i} is a compatibility form of {plain!r}: write {plain!r}"
        if category[0] == "L":
            script = unicodedata.name(c, "").split(" ", 1)[0]
            if script in _CONFUSABLE_SCRIPTS:
                scripts.setdefault(script, (i, c))
    if len(scripts) < 2:
        return None
    (first, _), (other, (i, c)) = sorted(scripts.items(), key=lambda kv: kv[1][0])[:2]
    return (
        f"{character_name(c)} at position {i}: mixes {other.capitalize()} and {first.capitalize()} letters, "
        "which look alike"
    )


def spellings(value: str) -> tuple[str, ...]:
    """A name as given and its NFC form, when they differ: what a filter or
    a pause matches, so rows stored before names were normalized are still
    found by their own spelling and by the normal one."""
    if value.isascii():
        return (value,)
    normal = unicodedata.normalize("NFC", value)
    return (value,) if normal == value else (value, normal)


def parse_int(raw: str, field: str, low: int, high: int = INT64_MAX) -> int:
    """An integer written in ASCII digits, from ``low`` to ``high``."""
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        raise InvalidField(field, f"must be an integer written in digits 0-9, got {raw[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise InvalidField(field, f"must be from {low} to {high}")
    return value


def fits_id(value: int) -> bool:
    """Whether ``value`` can be a row id (a positive BIGINT)."""
    return 1 <= value <= INT64_MAX


def check_result_size(text: str, max_bytes: int) -> None:
    """Raise ``ResultTooLarge`` when ``text`` (a result's compact JSON) is
    over ``max_bytes`` in UTF-8 (``max_result_bytes``); a character is at
    most 4 bytes, so only a text near the limit is encoded to count."""
    if len(text) * 4 > max_bytes and (size := len(text.encode("utf-8", "surrogatepass"))) > max_bytes:
        raise ResultTooLarge(size, max_bytes)


def max_body_bytes(max_payload_bytes: int) -> int:
    """The cap on a raw request body, larger than the payload limit it
    serves: ``max_payload_bytes`` counts the payload's compact UTF-8 JSON,
    and a client may send the same payload ASCII-escaped (``"€"`` is 3 bytes,
    ``"\\u20ac"`` 6; a 4-byte character is 12 escaped) or pretty-printed. Three
    times the limit plus 64 KiB admits every payload under it, and still
    bounds what a request makes the server read."""
    return 3 * max_payload_bytes + 64 * 1024


def max_bulk_body_bytes(max_bulk_bytes: int, max_payload_bytes: int) -> int:
    """The cap on a bulk enqueue's raw body: ``max_bulk_bytes``, and never
    less than one enqueue's (``max_body_bytes``), so a bulk of one job is
    never refused where the job alone is taken."""
    return max(max_bulk_bytes, max_body_bytes(max_payload_bytes))


MAX_PRIORITY = 1_000_000
"""Priorities run from ``-MAX_PRIORITY`` to ``MAX_PRIORITY``."""
PRIORITY_NUMBER = re.compile(r"-?(1000000|[0-9]{1,6})")
"""A priority written as a string: ASCII digits only (``"²".isdigit()`` is
true and ``int("²")`` fails); the pattern the OpenAPI document publishes."""


def parse_priority(value: Any, default: int = 0) -> int:
    """An integer, a numeric string in ASCII digits, or a label (any case)."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise InvalidField("priority", "must be an integer or one of low, medium, high, critical")
    if isinstance(value, int):
        if not -MAX_PRIORITY <= value <= MAX_PRIORITY:
            raise InvalidField("priority", f"must be between {-MAX_PRIORITY} and {MAX_PRIORITY}")
        return value
    if isinstance(value, str):
        if value.lower() in PRIORITY_LABELS:
            return PRIORITY_LABELS[value.lower()]
        if PRIORITY_NUMBER.fullmatch(value):
            return parse_priority(int(value))
    shown = value[:40] if isinstance(value, str) else value
    raise InvalidField("priority", f"unknown priority {shown!r}; use an integer or low, medium, high, critical")


def parse_time(value: Any, field: str) -> datetime:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidField(field, f"not an ISO 8601 time: {value!r}") from None
    else:
        raise InvalidField(field, "must be an ISO 8601 time string")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidField(field, f"{parsed.isoformat()} is outside the years 1 to 9999 in UTC") from None


def stored_time(text: Any) -> datetime | None:
    """An ISO time with its offset, as Jobdeck writes them into job payloads
    (an alert's ``at``, a schedule health episode), or None for anything
    else: a payload read back is data, and a bad one is not an error here."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def storable_text(value: str | None) -> str | None:
    """``value`` as every backend can store it in a text column: PostgreSQL
    refuses NUL (on every try, so an unchanged retry never succeeds), and
    neither driver can encode a lone surrogate (``surrogateescape``-decoded
    bytes in an exception message). NUL is written as the text ``\\x00``
    and a surrogate as ``\\udcXX``, so a person reading the error sees
    that something was there."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
