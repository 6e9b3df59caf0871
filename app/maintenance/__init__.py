"""Maintenance: the stalled-job rescue, retention, the per-minute roll-up, alerts and the cron schedules."""
