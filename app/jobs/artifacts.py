"""Artifacts: the files a handler keeps for people to download (a report, an
export), through ``ctx.artifact(name, data)``.

The bytes live in the database (``jobdeck.store.artifacts``), so every process
that serves the dashboard has them and retention deletes them with their
job. This module holds the rules an artifact must follow before it is
stored: its name becomes a file name in a ``Content-Disposition`` header and
on an operator's disk, so it is checked like the user data it is; its size
is bounded by ``[artifacts] max_bytes``; its content type is a plain media
type, never something that could split a header.
"""

from __future__ import annotations

import mimetypes
import os
import re
from pathlib import Path
from typing import Union

from jobdeck.core.errors import JobdeckError
from jobdeck.core.validation import hidden_problem

ArtifactData = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
"""What ``ctx.artifact`` takes: bytes, text (stored as UTF-8), or a path to
read the bytes from."""

MAX_NAME_BYTES = 255
"""A name's length in UTF-8: what most file systems take as a file name."""
MAX_CONTENT_TYPE_CHARS = 255
FALLBACK_TYPE = "application/octet-stream"

_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_CONTENT_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:\s*;\s*{_TOKEN}=(?:{_TOKEN}|\"[^\"\\\x00-\x1f\x7f]*\"))*")


class InvalidArtifact(JobdeckError, ValueError):
    """``ctx.artifact`` refused a name, content type or value: the attempt
    fails with this message, and is not retried (``HandlerSpec.retries``):
    the next attempt would build the same artifact and be refused again."""

    status_code = 422


class ArtifactTooLarge(InvalidArtifact):
    """Over ``[artifacts] max_bytes``: the attempt fails with this message,
    not retried like any ``InvalidArtifact``."""

    status_code = 413

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(
            f"artifact {name!r} is {human_bytes(size)} ({size} bytes); the limit is {human_bytes(limit)} "
            f"({limit} bytes, [artifacts] max_bytes)"
        )
        self.size = size
        self.limit = limit


def check_name(name: object) -> str:
    """``name`` if it can be a download's file name; otherwise
    ``InvalidArtifact`` saying why. No path separators (it names a file,
    not a place), no control or format characters, not ``.`` or ``..``, no
    surrounding spaces, at most ``MAX_NAME_BYTES`` bytes of UTF-8."""
    if not isinstance(name, str) or not name:
        raise InvalidArtifact("artifact name: must be a non-empty string")
    shown = ascii(name[:60])
    if "/" in name or "\\" in name:
        raise InvalidArtifact(f"artifact name {shown}: no path separators (/ or \\); it names one file")
    # Control, format and invisible characters (``hidden_character``: NUL, newlines, bidi
    # overrides that make ``report‮vsc.exe`` read as ``report.exe.csv``): each a way to forge a name.
    problem = hidden_problem(name)
    if problem is not None:
        raise InvalidArtifact(f"artifact name {shown}: {problem}")
    if name in (".", "..") or name != name.strip():
        raise InvalidArtifact(f"artifact name {shown}: not . or .., and no leading or trailing spaces")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidArtifact(f"artifact name {shown}...: at most {MAX_NAME_BYTES} bytes of UTF-8")
    return name


def check_content_type(content_type: object) -> str:
    """A media type such as ``text/csv; charset=utf-8``: type/subtype and
    parameters made of header tokens, so it can never split a header."""
    if (
        not isinstance(content_type, str)
        or len(content_type) > MAX_CONTENT_TYPE_CHARS
        or not _CONTENT_TYPE.fullmatch(content_type)
    ):
        raise InvalidArtifact(
            f"artifact content_type {ascii(str(content_type)[:60])}: expected a media type like text/csv"
        )
    return content_type


def default_content_type(name: str, text: bool) -> str:
    """The type the name's extension says (``mimetypes``), or
    ``application/octet-stream``; text given as ``str`` is UTF-8, and says so."""
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if text and (guessed is None or guessed.startswith("text/")):
        return f"{guessed or 'text/plain'}; charset=utf-8"
    return guessed or FALLBACK_TYPE


def read_data(name: str, data: ArtifactData, limit: int) -> tuple[bytes, bool]:
    """(the bytes, whether they came as text). A path's size is checked
    before it is read, so a huge file is refused without loading it."""
    if isinstance(data, str):
        try:
            encoded = data.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArtifact(f"artifact {name!r}: the text is not valid Unicode (a lone surrogate)") from None
        check_size(name, len(encoded), limit)
        return encoded, True
    if isinstance(data, (bytes, bytearray, memoryview)):
        check_size(name, memoryview(data).nbytes, limit)
        return bytes(data), False
    if isinstance(data, os.PathLike):
        path = Path(data)
        try:
            check_size(name, path.stat().st_size, limit)
            raw = path.read_bytes()
        except OSError as exc:
            raise InvalidArtifact(f"artifact {name!r}: cannot read {path}: {exc.strerror or exc}") from None
        check_size(name, len(raw), limit)  # it may have grown since the stat
        return raw, False
    raise InvalidArtifact(f"artifact {name!r}: expected bytes, str or a path, got {type(data).__name__}")


def check_size(name: str, size: int, limit: int) -> None:
    if size > limit:
        raise ArtifactTooLarge(name, size, limit)


def human_bytes(size: int) -> str:
    """``812 B``, ``3.2 KiB``, ``10.0 MiB``: sizes as the job page shows them."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
