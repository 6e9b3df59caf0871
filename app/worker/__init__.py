"""The worker pool and the cross-process wake-ups that feed it."""
