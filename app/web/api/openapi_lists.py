"""OpenAPI of the job list's byte budget (``max_list_bytes``,
``jobdeck.store.listing``), merged into ``jobdeck.web.api.openapi.document`` once
the other parts have completed the ``Job`` schema."""

from __future__ import annotations

import copy
from typing import Any

from jobdeck.store.listing import SIZED
from jobdeck.web.api.openapi_common import ref


def install(doc: dict[str, Any]) -> None:
    """``ListedJob``: a ``Job`` of a list, whose payload, result or error a
    page bounded by bytes may leave out (``null``, named in ``omitted``);
    ``GET /api/jobs`` lists them."""
    listed = copy.deepcopy(doc["components"]["schemas"]["Job"])
    listed["properties"]["payload"] = {
        "type": ["object", "null"],
        "additionalProperties": True,
        "description": "null when named in `omitted`",
    }
    listed["properties"]["omitted"] = {
        "type": "array",
        "items": {"enum": list(SIZED)},
        "description": "Fields left out of this list because each alone is over `max_list_bytes`: "
        "`GET /api/jobs/{job_id}` has them",
    }
    doc["components"]["schemas"]["ListedJob"] = listed
    listing = doc["paths"]["/api/jobs"]["get"]
    listing["description"] = (
        "A page holds at most `limit` jobs and at most `max_list_bytes` (2 MiB) of their payloads, results and "
        "errors together: it ends early, with `next_cursor` set, where the next job would pass that, and always "
        "holds at least one job. A payload, result or error over `max_list_bytes` by itself is left out (null) "
        "and named in the job's `omitted`."
    )
    doc["components"]["schemas"]["JobPage"]["properties"]["jobs"]["items"] = ref("ListedJob")
