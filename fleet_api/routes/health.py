"""``GET /api/health``: liveness, version, and whether the store and the sandbox can serve turns.

A store that answers reads but cannot take writes (a full disk, a read-only or deleted file) cannot
run a turn: it is reported as such, with status 503, from a tiny write probe and from the last error
of this process's event writer.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from fleet_api.deps import State
from fleet_api.schemas import ComponentHealth, Health
from fleet_kernel import __version__

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=Health,
    summary="Liveness and component status (no token needed)",
    responses={503: {"model": Health, "description": "The store cannot be read or written; `store.detail` says why"}},
)
async def health(state: State, response: Response) -> Health:
    backend = "sqlite" if state.store.sqlite else state.store.engine.dialect.name
    problem = None if await state.store.ping() else "unreachable"
    if problem is None:
        problem = await state.store.check_writable() or state.runner.store_error
    if state.sandbox_stale():
        await asyncio.to_thread(state.probe_sandbox)
    sandbox_ok, sandbox_detail = state.sandbox_status()
    if problem is not None:
        response.status_code = 503
    return Health(
        status="ok" if problem is None and sandbox_ok else "degraded",
        version=__version__,
        store=ComponentHealth(ok=problem is None, detail=backend if problem is None else f"{backend}: {problem}"),
        sandbox=ComponentHealth(ok=sandbox_ok, detail=sandbox_detail),
    )
