"""What a handler leaves behind, made safe to store: an exception's first
line, its traceback and a result's repr never raise, whatever the handler
returned or raised (a broken ``__str__`` or ``__repr__`` must not kill the
executor thread that reports it)."""

from __future__ import annotations

import json
import traceback

from jobdeck.core.validation import check_result_size

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""As the store writes a result."""


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
    """A handler's result as it is stored: itself when it is strict JSON,
    else its repr (NaN or Infinity would be stored and sent back as JSON that
    strict clients refuse, like the API refuses them in a payload). Raises
    ``ResultTooLarge`` past ``max_bytes`` of compact UTF-8 JSON."""
    if value is None:
        return None
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        value = safe_repr(value)
        text = json.dumps(value, ensure_ascii=False)
    check_result_size(text, max_bytes)
    return value
