"""What a handler leaves behind, made safe to store: an exception's first
line, its traceback and a value's repr never raise, whatever the handler
returned or raised (a broken ``__str__`` or ``__repr__`` must not kill the
executor thread that reports it), and a result is strict JSON or refused.

The rule for results, as ``json`` writes them: dicts, lists, strings,
finite numbers, booleans and None are kept; a tuple is kept as a list, and
an object key that is a number, a boolean or None as its JSON text (``1`` as
``"1"``), unless the same dict has that text as a key already (one would be lost). Anything else (a ``datetime``, a ``set``, ``bytes``, an object,
NaN or Infinity) fails the attempt with ``ResultNotJSON`` naming where it is:
``result["when"]: datetime is not JSON``."""

from __future__ import annotations

import json
import math
import sys
import traceback

from jobdeck.core.errors import ResultNotJSON
from jobdeck.core.validation import check_result_size

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""As the store writes a result."""
_SORTING = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True)
"""The check: sorting a dict's keys fails where text and other keys are mixed,
the only dicts where two keys can be written as one (``1`` and ``"1"``)."""

MAX_RESULT_DEPTH = 500
"""Nesting the search for a refused value walks; Python's encoder gives up
sooner (its recursion limit), so a result it wrote is never refused here."""


def first_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # a handler's exception whose __str__ itself raises
        text = "<unprintable>"
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def format_traceback() -> str | None:
    try:
        return traceback.format_exc()
    except Exception:
        return None


def safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


def storable_result(value: object, max_bytes: int) -> object:
    """A handler's result as it is stored: itself, when it is strict JSON.
    Raises ``ResultNotJSON`` when it is not, and ``ResultTooLarge`` past
    ``max_bytes`` of compact UTF-8 JSON; both are not retried."""
    if value is None:
        return None
    try:
        text = _SORTING.encode(value)
    except (TypeError, ValueError, RecursionError):
        try:
            text = _ENCODER.encode(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ResultNotJSON(*refused_part(value, exc)) from None
        clash = clashing_keys(value)  # keys of mixed types: rare, and walked only then
        if clash is not None:
            raise ResultNotJSON(*clash) from None
    check_result_size(text, max_bytes)
    return value


def clashing_keys(value: object) -> tuple[str, str] | None:
    """Where two keys of one dict are written as the same JSON text (``1`` and
    ``"1"``, ``True`` and ``"true"``): the store would keep one of them."""
    stack: list[tuple[object, str]] = [(value, "result")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            written: dict[str, object] = {}
            for key, child in item.items():
                text = key if isinstance(key, str) else _ENCODER.encode(key).strip('"')
                if text in written:
                    return (
                        where,
                        f"the keys {safe_repr(written[text])} and {safe_repr(key)} are both {json.dumps(text)} in JSON, one would be lost",
                    )
                written[text] = key
                stack.append((child, f"{where}[{json.dumps(text)}]"))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def refused_part(value: object, exc: BaseException) -> tuple[str, str]:
    """Where in ``value`` the encoder's ``exc`` came from, and why, found by
    an iterative walk in the encoder's order (the first offender is named)."""
    stack: list[tuple[object, str, int]] = [(value, "result", 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, int) and item.bit_length() > 10_000 and not _writable(item):
            return where, f"an integer of more than {sys.get_int_max_str_digits()} digits is not JSON"
        if item is None or isinstance(item, str | int):  # bool is an int
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, f"float {item!r} is not JSON"
            continue
        if depth > MAX_RESULT_DEPTH:
            return "result", _too_deep(exc)
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                if key is not None and not isinstance(key, str | int | float):
                    return where, f"the key {safe_repr(key)} is a {type(key).__name__}; JSON object keys are strings"
                if isinstance(key, float) and not math.isfinite(key):
                    return where, f"the key {key!r} is not JSON"
                children.append((child, f"{where}[{json.dumps(key) if isinstance(key, str) else key}]", depth + 1))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in reversed(list(enumerate(item))))
        else:
            return where, f"{type(item).__name__} is not JSON"
    if isinstance(exc, RecursionError):
        return "result", "is nested too deep to be written as JSON"
    return "result", f"is not JSON ({safe_repr(str(exc))})"


def _too_deep(exc: BaseException) -> str:
    if isinstance(exc, ValueError) and "ircular" in str(exc):
        return "holds itself (a circular reference) and is not JSON"
    return f"is nested deeper than {MAX_RESULT_DEPTH} levels and cannot be written as JSON"


def _writable(number: int) -> bool:
    """Whether Python writes ``number`` as text (its digits within ``sys.set_int_max_str_digits``)."""
    try:
        int.__repr__(number)
    except ValueError:
        return False
    return True
