"""Crontab fields to an APScheduler 3 trigger: five fields, or six with
seconds first, with crontab's day-of-week numbers."""

from __future__ import annotations

from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

_CRON_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def make_trigger(cron: str, tz: ZoneInfo) -> CronTrigger:
    """Five crontab fields, or six with seconds first. Day-of-week numbers are
    crontab's (0 or 7 = Sunday), not APScheduler 3's (0 = Monday)."""
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"expected 5 fields (or 6 with seconds first), got {len(fields)}")
    second = fields.pop(0) if len(fields) == 6 else "0"
    minute, hour, day, month, dow = fields
    return CronTrigger(
        second=second, minute=minute, hour=hour, day=day, month=month, day_of_week=_crontab_dow(dow), timezone=tz
    )


def _crontab_dow(text: str) -> str:
    if not all(c.isdigit() or c in "*,-/" for c in text):
        return text  # names (mon-fri) mean the same to both
    days: set[int] = set()
    for part in text.split(","):
        rng, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if rng == "*":
            lo, hi = 0, 6
        elif "-" in rng:
            lo, hi = (int(x) for x in rng.split("-", 1))
        else:
            lo = int(rng)
            hi = 6 if step_text else lo
        if not (0 <= lo <= 7 and 0 <= hi <= 7 and lo <= hi and step >= 1):
            raise ValueError(f"day of week {part!r} out of range 0-7")
        days.update(d % 7 for d in range(lo, hi + 1, step))
    return "*" if len(days) == 7 else ",".join(_CRON_DAYS[d] for d in sorted(days))
