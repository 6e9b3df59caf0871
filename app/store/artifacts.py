"""Artifacts' SQL: the files handlers keep for people to download
(``ctx.artifact``, rules in ``jobdeck.jobs.artifacts``), one row per job and name in
``job_artifacts``.

A store of a name the job already has replaces it, unless the row was
written by a later attempt: a timed-out attempt's thread that finishes late
never overwrites its retry's report. Lists never read the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.errors import ArtifactNotFound
from jobdeck.core.states import State
from jobdeck.store.models import job_artifacts, jobs, schedule_runs
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select

if TYPE_CHECKING:
    from jobdeck.store import Store

_INFO = [c for c in job_artifacts.c if c.name != "data"]


@dataclass(frozen=True)
class ArtifactInfo:
    """An artifact without its bytes: what lists show."""

    job_id: int
    attempt: int
    name: str
    content_type: str
    size: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> ArtifactInfo:
        m = row._mapping
        return cls(m["job_id"], m["attempt"], m["name"], m["content_type"], m["size"], m["created_at"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "content_type": self.content_type,
            "size": self.size,
            "attempt": self.attempt,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True)
class Artifact:
    info: ArtifactInfo
    data: bytes


def save_artifact(
    store: Store, job_id: int, attempt: int, name: str, content_type: str, data: bytes, now: datetime
) -> bool:
    """Store (or replace) ``name`` of ``job_id`` as written by ``attempt``.
    False when a later attempt's artifact of that name is already there
    (this one is stale and is dropped). One statement decides."""
    values = {"attempt": attempt, "content_type": content_type, "size": len(data), "data": data, "created_at": now}
    insert = dialect_insert(store.dialect)(job_artifacts).values(job_id=job_id, name=name, **values)
    stmt = insert.on_conflict_do_update(
        index_elements=["job_id", "name"],
        set_={key: insert.excluded[key] for key in values},
        where=job_artifacts.c.attempt <= insert.excluded.attempt,
    ).returning(job_artifacts.c.id)
    with store.write() as conn:
        return conn.execute(stmt).first() is not None


def artifacts_of(store: Store, job_id: int) -> list[ArtifactInfo]:
    """A job's artifacts by name (the job page, the API's list)."""
    with store.read() as conn:
        rows = conn.execute(select(*_INFO).where(job_artifacts.c.job_id == job_id).order_by(job_artifacts.c.name)).all()
    return [ArtifactInfo.from_row(r) for r in rows]


def get_artifact(store: Store, job_id: int, name: str) -> Artifact:
    """One artifact with its bytes; ``ArtifactNotFound`` if the job has none by that name."""
    with store.read() as conn:
        row = conn.execute(
            select(*job_artifacts.c).where(job_artifacts.c.job_id == job_id, job_artifacts.c.name == name)
        ).first()
    if row is None:
        raise ArtifactNotFound(job_id, name)
    return Artifact(ArtifactInfo.from_row(row), bytes(row.data))


def last_completed_artifacts(store: Store, schedules: Sequence[str]) -> dict[str, tuple[int, list[ArtifactInfo]]]:
    """For each named schedule whose runs ever completed: the newest
    completed run's job and its artifacts (the Schedules page's "last
    report" link). Walks each schedule's runs newest first, stopping at the
    first completed job."""
    found: dict[str, tuple[int, list[ArtifactInfo]]] = {}
    with store.read() as conn:
        for name in schedules:
            job_id = conn.execute(
                select(schedule_runs.c.job_id)
                .select_from(schedule_runs.join(jobs, jobs.c.id == schedule_runs.c.job_id))
                .where(schedule_runs.c.schedule == name, jobs.c.status == State.COMPLETED.value)
                .order_by(schedule_runs.c.id.desc())
                .limit(1)
            ).scalar()
            if job_id is None:
                continue
            rows = conn.execute(
                select(*_INFO).where(job_artifacts.c.job_id == job_id).order_by(job_artifacts.c.name)
            ).all()
            found[name] = (job_id, [ArtifactInfo.from_row(r) for r in rows])
    return found
