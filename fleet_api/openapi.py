"""The committed OpenAPI document: ``python -m fleet_api.openapi > openapi.json`` regenerates it.

The document does not depend on settings (token, limits), so the committed file is the same for
every deployment; ``tests/api/test_health_skills.py`` fails when it drifts from the code. What the app
serves at ``/api/openapi.json`` and ``/api/docs`` is ``fleet_api.docs``'s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fleet_api.app import create_app
from fleet_kernel.config import Settings


def build_openapi() -> dict[str, Any]:
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
