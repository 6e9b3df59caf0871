"""Presentation helpers: Jinja filters and globals (relative times in
``<time>``, durations, pretty JSON, attempts allowed, from ``jobdeck.present``) and the geometry of the overview's server-rendered SVG charts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import Flask
from jobdeck.core.states import priority_label
from jobdeck.present import attempts_allowed, attempts_text, not_retried
from markupsafe import Markup


def human_seconds(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds else "0 s"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def relative(value: datetime | None, now: datetime) -> str:
    """'12 s ago' or 'in 3 min'."""
    if value is None:
        return "—"
    delta = (now - value).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"{human_seconds(delta)} ago" if delta > 0 else f"in {human_seconds(delta)}"


def when(value: datetime | None, now: datetime) -> Markup:
    """A time as people read it ("12 s ago"), in a ``<time>`` whose
    ``datetime`` and title carry the exact UTC time: the title for a hover,
    and for the dashboard's absolute-time switch (static/js/dashboard.js),
    which shows the title in place of the relative text."""
    if value is None:
        return Markup("—")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        value.isoformat(), iso(value), relative(value, now)
    )


def first_line(text: str | None, width: int = 140) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def iso(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: int) -> str:
    return f"{value:,}"


def register(app: Flask) -> None:
    app.jinja_env.filters.update(
        seconds=human_seconds,
        first_line=first_line,
        pretty_json=pretty_json,
        iso=iso,
        number=number,
        priority_label=priority_label,
    )
    app.jinja_env.globals.update(
        relative=relative, when=when, attempts_allowed=attempts_allowed, attempts_text=attempts_text,
        not_retried=not_retried,
    )  # fmt: skip


# -- charts ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    ok_y: float
    ok_h: float
    fail_y: float
    fail_h: float
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    peak: float
    bars: list[Bar]
    line: str
    """SVG polyline points for line charts."""
    first: str
    last: str
    total_ok: int = 0
    total_failed: int = 0


W, H = 600, 120


def throughput_chart(series: list[tuple[datetime, int, int]]) -> Chart:
    """Stacked bars per minute: completed below, failed on top."""
    peak = max([ok + failed for _, ok, failed in series] + [1])
    step = W / max(1, len(series))
    bars = []
    for i, (minute, ok, failed) in enumerate(series):
        ok_h = H * ok / peak
        fail_h = H * failed / peak
        bars.append(
            Bar(
                x=round(i * step + 1, 1),
                width=round(max(1.0, step - 2), 1),
                ok_y=round(H - ok_h, 1),
                ok_h=round(ok_h, 1),
                fail_y=round(H - ok_h - fail_h, 1),
                fail_h=round(fail_h, 1),
                title=f"{minute:%H:%M} UTC: {ok} completed, {failed} failed",
            )
        )
    return Chart(
        W, H, peak, bars, "",
        first=f"{series[0][0]:%H:%M}" if series else "", last=f"{series[-1][0]:%H:%M}" if series else "",
        total_ok=sum(s[1] for s in series), total_failed=sum(s[2] for s in series),
    )  # fmt: skip


def latency_chart(history: list[tuple[datetime, float]], now: datetime) -> Chart:
    """Queue latency over the last hour, one point per minute sampled. Its
    ``peak`` is the longest wait sampled (0 with no sample); the line is
    drawn to a scale of at least one second, so waits of a few milliseconds
    stay at the bottom instead of filling the chart."""
    peak = max((v for _, v in history), default=0.0)
    scale = max(peak, 1.0)
    start = now.timestamp() - 3600
    points = []
    for at, value in history:
        x = W * max(0.0, (at.timestamp() - start)) / 3600
        y = H - (H - 4) * value / scale
        points.append(f"{x:.1f},{y:.1f}")
    if len(points) == 1:
        points.append(f"{W},{points[0].split(',')[1]}")
    return Chart(W, H, peak, [], " ".join(points), first="-60 min", last="now")
