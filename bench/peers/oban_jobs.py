"""oban-py's no-op worker, in a module of its own: the consumer process
resolves the worker by the module path stored with the job."""

import pg_harness
from oban import worker


@worker(queue="bench")
class Noop:
    async def process(self, job) -> None:  # type: ignore[no-untyped-def]
        pg_harness.report_start(job.args.get("i"))
