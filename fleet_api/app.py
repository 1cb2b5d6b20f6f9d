"""``create_app(settings)``: the FastAPI app over the shared store.

The lifespan opens one ``Store`` and one ``TurnRunner`` per process; routes are split by resource
under ``fleet_api.routes``; errors are rendered by ``fleet_api.errors`` alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.routing import Match
from starlette.types import Scope

from fleet_api import compat, routes
from fleet_api.auth import BearerAuth
from fleet_api.deps import FleetState
from fleet_api.docs import install_docs_redirect, install_openapi
from fleet_api.errors import install_error_handlers
from fleet_api.hosts import AllowedHosts, own_names
from fleet_api.limits import BodyLimit
from fleet_api.origin import SameOriginWrites
from fleet_api.routes import metrics
from fleet_api.routes.attachments import UPLOAD_PATH
from fleet_api.routes.workspace import RAW_PATHS
from fleet_api.sse import HEARTBEAT_S
from fleet_api.tail import StoreTail
from fleet_kernel import __version__
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.store import Store

log = logging.getLogger("fleet_api")

REAP_INTERVAL_S = 1.0  # a dead owner's turn ends within a second or so (a read when nothing is stale)
DESCRIPTION = (
    "Sessions, turns and their event streams from Fleet's shared store: watch, continue or cancel a "
    'notebook session from any HTTP client. Errors are `{"error": {"code", "message"}}`. '
    "When FLEET_API_TOKEN is set, every route but /api/health and these docs needs `Authorization: Bearer <token>` "
    "(the Authorize button sets it for Try it out). "
    "Requests must name this server in `Host` (421 otherwise); POST, PUT, PATCH and DELETE from another "
    "origin are refused (403) and their bodies must be application/json (multipart/form-data for "
    "uploads, application/octet-stream for a workspace file; 415 otherwise)."
)


async def _reap_forever(runner: TurnRunner) -> None:
    """Mark turns whose process died as interrupted, so their watchers get a terminal event."""
    while True:
        await asyncio.sleep(REAP_INTERVAL_S)
        try:
            await runner.reap()
        except Exception:  # the store may be down for a moment; try again at the next round
            log.warning("reaping stale turns failed", exc_info=True)


def _warm_up(state: FleetState) -> None:
    """In a thread at start-up: probe the sandbox and import the engine's dspy side, so neither the
    first health check nor the first turn pays for it."""
    state.probe_sandbox()
    try:
        import fleet_kernel.engine.turn  # noqa: F401 - this is the warm-up: dspy loads here, off the request path
    except ImportError:
        log.warning("the engine cannot be imported; turns will fail", exc_info=True)


def create_app(
    settings: Settings | None = None, *, heartbeat_s: float = HEARTBEAT_S, bind_host: str | None = None
) -> FastAPI:
    """Build the app. ``settings`` default to ``load_settings()``; ``heartbeat_s`` spaces SSE comments;
    ``bind_host`` (``fleet serve --host``) is one of the names the app answers for."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(settings.database_url)
        try:
            runner = TurnRunner(store, settings)
            await asyncio.to_thread(runner.host_tools.functions)  # a bad [[tools]] path stops start-up (ConfigError)
            await runner.open()
            tail = StoreTail(store, runner.hub)
            app.state.fleet = FleetState(settings, store, runner, heartbeat_s, tail)
            loop = asyncio.get_running_loop()
            janitor = loop.create_task(_reap_forever(runner), name="fleet-reaper")
            warm = loop.create_task(asyncio.to_thread(_warm_up, app.state.fleet), name="fleet-warm-up")
            try:
                yield
            finally:
                janitor.cancel()
                await asyncio.gather(janitor, warm, return_exceptions=True)
                await tail.close()
                await runner.close()
        finally:
            await store.close()

    app = FastAPIOffline(  # Swagger UI from the package's own files, not a CDN: the docs work offline
        title="Fleet API",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        static_url="/api/docs/static",
        swagger_ui_oauth2_redirect_url="/api/docs/oauth2-redirect",
    )
    install_error_handlers(app)
    install_openapi(app)
    install_docs_redirect(app)
    for router in routes.ROUTERS:
        app.include_router(router, prefix="/api")
    app.include_router(metrics.router)
    for profile in compat.ROUTERS:  # fleet-rlm's wire profile (0.8.1, 0.7.11), under its own prefix
        app.include_router(profile, include_in_schema=False)
    upload_limit = int(settings.policy.storage.max_upload_mb * 1024 * 1024)
    upload_paths = re.compile(rf"^{re.escape(UPLOAD_PATH)}$|{compat.UPLOAD_PATHS}")
    names = own_names(settings.allowed_hosts, bind_host)
    app.add_middleware(
        BodyLimit,
        upload_limit=upload_limit,
        upload_paths=upload_paths,
        raw_paths=RAW_PATHS,
        refusals=[compat.v0711.OVERSIZE],  # 0.7.11 refuses an oversize upload with its own 400
    )
    proxies = frozenset(settings.allowed_hosts)  # an Origin of a loopback or bind name must be this very origin

    def routed(scope: Scope) -> bool:
        return any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)

    app.add_middleware(SameOriginWrites, names=proxies, upload_paths=upload_paths, raw_paths=RAW_PATHS, routed=routed)
    if settings.api_token is not None:
        app.add_middleware(BearerAuth, token=settings.api_token.get_secret_value())
    app.add_middleware(AllowedHosts, names=names)  # added last, so it runs first
    return app
