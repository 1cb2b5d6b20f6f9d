"""Store rows as response bodies: the contract's fields first, then the extensions."""

from __future__ import annotations

from fleet_api.schemas import Turn
from fleet_kernel.store import TurnRow
from fleet_kernel.store.cells import Lineage


def turn_view(row: TurnRow, lineage: Lineage | None = None) -> Turn:
    """The turn object; ``lineage`` (``Store.lineage`` of its session) fills ``superseded_by`` and ``in_history``."""
    return Turn.model_validate(
        {
            **row.to_dict(),
            "position": row.position,
            "last_seq": row.last_seq,
            "model": row.model,
            "sandbox": row.sandbox,
            "cancel_requested": row.cancel_requested_at is not None,
            "cell_id": row.cell_id,
            "supersedes_turn_id": row.supersedes_turn_id,
            "superseded_by": lineage.superseded_by.get(row.turn_id) if lineage is not None else None,
            "in_history": lineage is not None and lineage.in_history(row.turn_id),
        }
    )
