"""Fleet's HTTP front door: the FastAPI app that serves sessions, turns and their events from the shared store."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m fleet_api.openapi` and `fleet --help` do not import the whole app first.
    if name == "create_app":
        from fleet_api.app import create_app  # FastAPI and the engine load only when the app is built

        return create_app
    raise AttributeError(name)
