"""``create_app(settings)``: the FastAPI app over the shared store.

The lifespan opens one ``Store`` and one ``TurnRunner`` per process; routes are split by resource
under ``fleet_api.routes``; errors are rendered by ``fleet_api.errors`` alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from fleet_api import routes
from fleet_api.auth import BearerAuth
from fleet_api.deps import FleetState
from fleet_api.errors import install_error_handlers
from fleet_api.limits import BodyLimit
from fleet_api.openapi import install_openapi
from fleet_api.routes.attachments import UPLOAD_PATH
from fleet_api.sse import HEARTBEAT_S
from fleet_kernel import __version__
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.store import Store

DESCRIPTION = (
    "Sessions, turns and their event streams from Fleet's shared store: watch, continue or cancel a "
    "notebook session from any HTTP client. Errors are `{\"error\": {\"code\", \"message\"}}`. "
    "When FLEET_API_TOKEN is set, every route but /api/health needs `Authorization: Bearer <token>`."
)


def create_app(settings: Settings | None = None, *, heartbeat_s: float = HEARTBEAT_S) -> FastAPI:
    """Build the app. ``settings`` default to ``load_settings()``; ``heartbeat_s`` spaces SSE comments."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(settings.database_url)
        try:
            runner = await TurnRunner(store, settings).open()
            app.state.fleet = FleetState(settings, store, runner, heartbeat_s)
            try:
                yield
            finally:
                await runner.close()
        finally:
            await store.close()

    app = FastAPI(
        title="Fleet API",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    install_openapi(app)
    for router in routes.ROUTERS:
        app.include_router(router, prefix="/api")
    upload_limit = int(settings.policy.storage.max_upload_mb * 1024 * 1024)
    app.add_middleware(BodyLimit, upload_limit=upload_limit, upload_paths=frozenset({UPLOAD_PATH}))
    if settings.api_token is not None:  # added last, so it runs first
        app.add_middleware(BearerAuth, token=settings.api_token.get_secret_value())
    return app
