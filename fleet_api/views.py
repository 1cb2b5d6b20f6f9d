"""Store rows as response bodies: the contract's fields first, then the extensions."""

from __future__ import annotations

from fleet_api.schemas import Turn
from fleet_kernel.store import TurnRow


def turn_view(row: TurnRow) -> Turn:
    return Turn.model_validate(
        {
            **row.to_dict(),
            "position": row.position,
            "last_seq": row.last_seq,
            "model": row.model,
            "sandbox": row.sandbox,
            "cancel_requested": row.cancel_requested_at is not None,
        }
    )
