"""Routes, one module per resource; ``ROUTERS`` is mounted under ``/api`` by ``create_app``.

Every module of this package with a ``router`` is mounted, so a new resource is one module here (and
its models in ``schemas.py``): those named in ``ORDER`` first, in that order (the order of the paths in
``openapi.json``), then any other by name. ``metrics`` is served outside ``/api`` (``GET /metrics``).
"""

import importlib
import pkgutil

from fastapi import APIRouter

ORDER = (
    "health",
    "sessions",
    "notebook",
    "turns",
    "runs",
    "attachments",
    "artifacts",
    "volume",
    "skills",
    "tools",
    "memory",
    "workspace",
    "feedback",
    "evals",
)
OUTSIDE_API = ("metrics",)


def _routers() -> list[APIRouter]:
    found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")} - set(OUTSIDE_API)
    names = [name for name in ORDER if name in found] + sorted(found - set(ORDER))
    return [importlib.import_module(f"{__name__}.{name}").router for name in names]


ROUTERS = _routers()
