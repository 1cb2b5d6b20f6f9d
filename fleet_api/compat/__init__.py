"""Second wire profiles over Fleet's engine and store: fleet-rlm's HTTP + SSE contracts under
``/compat/fleet-rlm``, 0.8.1's (``routes``: paths without ``/api``) and 0.7.11's (``v0711``: paths under
``/api``). Fleet's own API (``/api``) is unchanged by them."""

from fleet_api.compat import v0711
from fleet_api.compat.routes import ATTACH_PATH, PREFIX, router

ROUTERS = (router, v0711.router)
UPLOAD_PATHS = rf"{ATTACH_PATH}|{v0711.ATTACH_PATH}"

__all__ = ["PREFIX", "ROUTERS", "UPLOAD_PATHS", "v0711"]
