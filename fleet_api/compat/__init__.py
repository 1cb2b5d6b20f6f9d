"""Second wire profiles over Fleet's engine and store: ``fleet_rlm`` speaks fleet-rlm 0.8.1's HTTP + SSE
contract under ``/compat/fleet-rlm``. Fleet's own API (``/api``) is unchanged by them."""

from fleet_api.compat.routes import ATTACH_PATH, PREFIX, router

__all__ = ["ATTACH_PATH", "PREFIX", "router"]
