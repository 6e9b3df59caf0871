"""A job's place in a workflow or a batch, for the job page's links
(``templates/_workflow_job_links.html``): its workflow and step, or its
batch, and its dependencies and dependents with their states."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobdeck.store import JobRecord, Store
from jobdeck.store.graph import BatchNotFound, BatchRecord, WorkflowRecord


@dataclass(frozen=True)
class Membership:
    workflow: WorkflowRecord | None = None
    batch: BatchRecord | None = None
    dependencies: list[JobRecord] = field(default_factory=list)
    dependents: list[JobRecord] = field(default_factory=list)


def membership_of(store: Store, job: JobRecord) -> Membership | None:
    """None for a plain job (most jobs: nothing read). The workflow is read
    as the newest one at or below its id, which is the one row with its
    counts, not its every job."""
    if job.workflow_id is None and job.batch_id is None:
        return None
    workflow = None
    dependencies: list[JobRecord] = []
    dependents: list[JobRecord] = []
    if job.workflow_id is not None:
        found = store.list_workflows(limit=1, before=job.workflow_id + 1)
        workflow = found[0] if found and found[0].id == job.workflow_id else None
        dependencies, dependents = store.dependencies_of(job.id)
    batch = None
    if job.batch_id is not None:
        try:
            batch = store.batch(job.batch_id)
        except BatchNotFound:
            batch = None
    return Membership(workflow, batch, dependencies, dependents)
