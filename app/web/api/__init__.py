"""The JSON API under /api, and its OpenAPI document.

Importing the package adds the external-worker protocol
(``jobdeck.web.api.worker_protocol``), the workflow and batch routes
(``jobdeck.web.api.workflows``), the bulk enqueue (``jobdeck.web.api.bulk``),
the worker pools (``jobdeck.web.api.workers``)
and the document's own route (``jobdeck.web.api.openapi``) to the ``api``
blueprint, so they are there before any app registers it."""

from jobdeck.web.api import bulk as bulk
from jobdeck.web.api import openapi as openapi
from jobdeck.web.api import worker_protocol as worker_protocol
from jobdeck.web.api import workers as workers
from jobdeck.web.api import workflows as workflows
