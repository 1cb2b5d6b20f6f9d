"""The committed OpenAPI document: ``python -m fleet_api.openapi > openapi.json`` regenerates it.

The document does not depend on settings (token, limits), so the committed file is the same for
every deployment; ``tests/api/test_openapi.py`` fails when it drifts from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import RedirectResponse

from fleet_kernel.config import Settings

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


def build_openapi() -> dict[str, Any]:
    from fleet_api.app import create_app  # the app imports this module

    settings = Settings(home=Path("/nonexistent"), database_url="sqlite+aiosqlite:///:memory:")
    return create_app(settings).openapi()


def render() -> str:
    return json.dumps(build_openapi(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args:
        Path(args[0]).write_text(render(), encoding="utf-8")
    else:
        sys.stdout.write(render())


if __name__ == "__main__":
    main()
