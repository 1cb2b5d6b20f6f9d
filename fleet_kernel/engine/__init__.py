"""The engine both front doors call: ``TurnRunner`` runs turns and serves their events."""

from fleet_kernel.engine.runner import TurnHandle, TurnRunner

__all__ = ["TurnHandle", "TurnRunner"]
