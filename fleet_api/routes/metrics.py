"""``GET /metrics``: this process's Prometheus metrics (text format), behind the bearer token when one is set.

Mounted at the root, where Prometheus scrapes by default, not under ``/api``.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from fleet_kernel.telemetry import metrics

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics: turns, LM calls and tokens, cost, sandboxes, SSE clients, store commits",
    response_class=Response,
    include_in_schema=False,  # not part of the /api contract; docs/observability.md describes it
    responses={200: {"content": {metrics.CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def prometheus_metrics() -> Response:
    return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE_LATEST)
