"""The no-op job, importable by name by RQ's worker processes."""


def noop() -> None:
    """Does nothing: the benchmark measures the queue, not the job."""
