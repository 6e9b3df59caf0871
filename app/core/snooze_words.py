"""What a snoozed attempt's row says ("snoozed for 30 s: rate limited"):
written by the store when it records the snooze, and by ``Snooze`` itself
as its message (``jobdeck.jobs.snooze``)."""

from __future__ import annotations


def describe(seconds: float, reason: str | None = None) -> str:
    text = f"snoozed for {format_seconds(seconds)}"
    return f"{text}: {reason}" if reason else text


def format_seconds(seconds: float) -> str:
    """30 -> "30 s", 1.5 -> "1.5 s", 0.25 -> "0.25 s", 86400.5 -> "86400.5 s",
    1e-9 -> "under 1 ms": never in scientific notation."""
    if seconds == int(seconds):
        return f"{seconds:.0f} s"
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return "under 1 ms" if text == "0" else f"{text} s"
