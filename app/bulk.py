"""Bulk enqueue on SQLite: validate and serialize a batch in one pass.

``enqueue_many`` of plain jobs (``{"type": ..., "payload": {...}}``, the
common bulk shape) spent more time building a ``NewJob`` per item and then a
parameter tuple from it than SQLite spent inserting the row. Here each item
becomes its INSERT parameters directly: the type is validated (and its
defaults looked up) once per distinct type by ``Jobdeck.new_job`` itself, the
payload is encoded once, and its size is checked without encoding to bytes
unless it could be over the limit. Any other item shape, or anything this
pass does not accept, goes through ``new_job`` so the errors are exactly its
errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from app.errors import PayloadTooLarge
from app.store.sqlite import db_time

if TYPE_CHECKING:
    from app.deck import Jobdeck

_PLAIN = frozenset({"type", "payload"})


def plain_rows(deck: Jobdeck, items: Sequence[Mapping[str, Any]], now: datetime) -> list[tuple[Any, ...]] | None:
    """``sqlite_hot.INSERT_JOB`` parameters for ``items``, or None when an
    item has more than a type and a payload (the caller then validates each
    with ``new_job``). Raises what ``new_job`` raises for a bad item."""
    from app.deck import _ENCODER

    t = db_time(now)
    limit = deck.config.max_payload_bytes
    defaults: dict[Any, tuple[str, int, int]] = {}
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    encode = _ENCODER.encode
    for item in items:
        if type(item) is not dict or not _PLAIN.issuperset(item):
            return None
        job_type = item.get("type")
        d = defaults.get(job_type) if type(job_type) is str else None
        if d is None:
            new = deck.new_job(item, now)  # the full checks, once per type
            d = defaults[new.type] = (new.queue, new.priority, new.max_retries)
            append((new.type, d[0], new.payload_json, d[1], d[2], None, t, t, t))
            continue
        payload = item.get("payload")
        if not payload and (payload is None or type(payload) is dict):
            text = "{}"
        elif type(payload) is dict:
            try:
                text = encode(payload)
            except (TypeError, ValueError):
                deck.new_job(item, now)  # raises InvalidField naming the payload
                raise
            # A character is at most 4 bytes in UTF-8: count bytes only near the limit.
            if len(text) * 4 > limit and (size := len(text.encode())) > limit:
                raise PayloadTooLarge(size, limit)
        else:
            deck.new_job(item, now)  # raises: the payload is not an object
            return None
        append((job_type, d[0], text, d[1], d[2], None, t, t, t))
    return rows
