"""OpenAPI path of ``GET /metrics`` (``jobdeck.web.metrics``), merged into
``jobdeck.web.api.openapi.document``. Not under /api/, but guarded like it."""

from __future__ import annotations

from typing import Any


def paths() -> dict[str, Any]:
    return {
        "/metrics": {
            "get": {
                "operationId": "getMetrics",
                "tags": ["process"],
                "summary": "Prometheus metrics (text exposition format 0.0.4)",
                "description": "Jobs per state and queue, runs per type and outcome (counters that never go "
                "down), run-time histograms, queue latency, live workers, schedules' last success. "
                'See the README\'s "Metrics and alerts" for the list.',
                "responses": {
                    "200": {
                        "description": "The exposition text",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                },
            }
        }
    }
