"""Artifacts in the dashboard: the job page's list (``_job_artifacts.html``,
refreshed on ``jd-poll`` while the job can still store more) and the
download, behind the dashboard's login like every page; viewers may
download. The file response is the API's (``jobdeck.web.api.artifacts.download``).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, render_template
from jobdeck.core.errors import JobNotFound
from jobdeck.jobs.artifacts import check_name, human_bytes
from jobdeck.store.artifacts import ArtifactInfo, artifacts_of, get_artifact
from jobdeck.web.api.artifacts import download
from jobdeck.web.dashboard.replies import deck
from jobdeck.web.dashboard.views import POLLED_STATES

bp = Blueprint("artifacts", __name__)


@bp.app_template_global("job_artifacts")
def job_artifacts(job_id: int) -> list[ArtifactInfo]:
    """The job page's partial reads its list through this, so any view that
    renders the page (or its detail after an action) shows it."""
    return artifacts_of(deck().store, job_id)


@bp.app_template_filter("bytes")
def _bytes(size: int) -> str:
    return human_bytes(size)


@bp.get("/fragments/jobs/<int:job_id>/artifacts")
def job_artifacts_live(job_id: int) -> Any:
    try:
        job = deck().store.get(job_id)
    except JobNotFound:
        abort(404, f"job {job_id} does not exist")
    return render_template("_job_artifacts.html", job=job, polling=job.status in POLLED_STATES)


@bp.get("/jobs/<int:job_id>/artifacts/<name>")
def download_artifact(job_id: int, name: str) -> Any:
    check_name(name)
    return download(get_artifact(deck().store, job_id, name))
