"""How large a request body may be, per path: one enqueue's cap for every
request, and a larger one for the bulk enqueue (``max_bulk_bytes``).

The app enforces these (``MAX_CONTENT_LENGTH``, raised by the bulk view for
its own request), and so do both servers of ``jobdeck serve``, which read a
body before the app runs: a body over its path's cap is refused unread
when its length is declared, and cut off once it passes the cap when it is
chunked. Only core imports here, so a server's supervisor loads no Flask.
"""

from __future__ import annotations

from jobdeck.core.config import Config
from jobdeck.core.validation import max_body_bytes, max_bulk_body_bytes

BULK_PATH = "/api/jobs/bulk"
"""``POST /api/jobs/bulk`` (``jobdeck.web.api.bulk``), as the servers see its path."""


def body_cap(config: Config) -> int:
    """Every request's body cap but the paths of ``larger_bodies``."""
    return max_body_bytes(config.max_payload_bytes)


def larger_bodies(config: Config) -> dict[str, int]:
    """The paths whose body may pass ``body_cap``, and their caps."""
    return {BULK_PATH: max_bulk_body_bytes(config.max_bulk_bytes, config.max_payload_bytes)}


def too_large(cap: int, path: str) -> str:
    """The 413's words, the same from the app and from the server, naming
    the setting that sizes the path's cap."""
    setting = "max_bulk_bytes" if path == BULK_PATH else "max_payload_bytes"
    return f"request body too large: at most {cap} bytes ({setting})"
