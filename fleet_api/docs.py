"""The API's own description, served at ``/api/openapi.json`` and ``/api/docs``: the bearer token in the
schema, and ``/docs`` leading to the interactive docs. ``fleet_api.openapi`` writes the committed copy.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import RedirectResponse

OPEN_OPERATIONS = {("/api/health", "get")}


def install_openapi(app: FastAPI) -> None:
    """Document the bearer token: optional on loopback, required once FLEET_API_TOKEN is set."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "the value of FLEET_API_TOKEN"}
            }
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    if (path, method) not in OPEN_OPERATIONS:
                        operation["security"] = [{"bearer": []}, {}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_docs_redirect(app: FastAPI) -> None:
    """``/docs``, where FastAPI apps usually keep it, leads to the interactive docs at ``/api/docs``."""

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/api/docs")
