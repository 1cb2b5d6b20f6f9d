"""Fleet's HTTP front door: the FastAPI app that serves sessions, turns and their events from the shared store."""

from fleet_api.app import create_app

__all__ = ["create_app"]
