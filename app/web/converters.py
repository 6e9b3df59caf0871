"""The URL converters every route uses: ids that fit a row, and names that
may hold a line break. In the web package: Werkzeug's routing is 11 MB of a
process that only works jobs (``jobdeck worker``) would otherwise import."""

from __future__ import annotations

from jobdeck.core.validation import INT64_MAX
from werkzeug.routing import IntegerConverter, Map, PathConverter


class IdConverter(IntegerConverter):
    """Every route's ``<int:...>``: ASCII digits up to ``INT64_MAX``. A longer
    number matches no route, so ``/api/jobs/99999999999999999999`` is a 404
    (no such job) instead of an ``OverflowError`` in the database driver."""

    regex = r"[0-9]{1,19}"

    def __init__(self, map: Map, fixed_digits: int = 0, min: int | None = None, max: int | None = INT64_MAX) -> None:
        super().__init__(map, fixed_digits=fixed_digits, min=min, max=max)


class NamePathConverter(PathConverter):
    """Every route's ``<path:...>`` (queue and schedule names): like
    Werkzeug's, but a newline or other line break in the name matches too,
    so the view answers with its own words (a queue or schedule by that
    name, or a 422) instead of a bare 404 from the router."""

    regex = r"[^/](?s:.)*?"
