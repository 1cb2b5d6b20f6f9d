"""``GET /api/health``: liveness, version, and whether the store and the sandbox can serve turns."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from fleet_api.deps import State
from fleet_api.schemas import ComponentHealth, Health
from fleet_kernel import __version__

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness and component status (no token needed)")
async def health(state: State) -> Health:
    store_ok = await state.store.ping()
    backend = "sqlite" if state.store.sqlite else state.store.engine.dialect.name
    if state.sandbox_stale():
        await asyncio.to_thread(state.probe_sandbox)
    sandbox_ok, sandbox_detail = state.sandbox_status()
    return Health(
        status="ok" if store_ok and sandbox_ok else "degraded",
        version=__version__,
        store=ComponentHealth(ok=store_ok, detail=backend if store_ok else f"{backend}: unreachable"),
        sandbox=ComponentHealth(ok=sandbox_ok, detail=sandbox_detail),
    )
