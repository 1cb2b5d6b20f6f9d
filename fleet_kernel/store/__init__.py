"""The durable store: one ``Store`` over one engine, its methods named for what they do.

Split by concern: ``connection`` (engines, SQLite tuning, health), ``sessions``, ``turns`` (claims,
reads, the history a turn sees), ``leases`` (owners, heartbeats, cancellation, ending abandoned
turns), ``event_log`` (every turn's events) and ``files`` (attachments, artifacts, blobs),
``memories``, ``feedback`` and ``summaries`` (history summaries). Every process that runs or watches
turns opens its own ``Store`` on the same URL.
The store writes no event itself: the engine's one writer does (see ``leases``).
"""

from __future__ import annotations

import inspect

from fleet_kernel.store.connection import describe_write_error, is_disk_full, uninterrupted
from fleet_kernel.store.event_log import EVENTS_CHANNEL, EventLog, TurnEnding
from fleet_kernel.store.feedback import FeedbackStore
from fleet_kernel.store.files import FileStore
from fleet_kernel.store.leases import HUNG_AFTER, LEASE, PROCESS_OWNER, EndedTurn, LeaseStore
from fleet_kernel.store.memories import MemoryStore
from fleet_kernel.store.models import (
    ArtifactRow,
    AttachmentRow,
    FeedbackRow,
    HistorySummaryRow,
    MemoryRow,
    SessionRow,
    TurnRow,
    new_id,
    utcnow,
)
from fleet_kernel.store.summaries import HistoryRead, SummaryStore
from fleet_kernel.store.turns import Claim, TurnStore

__all__ = [
    "EVENTS_CHANNEL",
    "HUNG_AFTER",
    "LEASE",
    "PROCESS_OWNER",
    "ArtifactRow",
    "AttachmentRow",
    "Claim",
    "EndedTurn",
    "FeedbackRow",
    "HistoryRead",
    "HistorySummaryRow",
    "MemoryRow",
    "SessionRow",
    "Store",
    "TurnEnding",
    "TurnRow",
    "describe_write_error",
    "is_disk_full",
    "new_id",
    "utcnow",
]  # fmt: skip


class Store(TurnStore, LeaseStore, EventLog, FileStore, MemoryStore, FeedbackStore, SummaryStore):
    """Sessions, turns, events, attachments, artifacts, blobs, memories, feedback and history summaries over
    one async engine."""


# Every public coroutine method of the store runs to completion once started (see ``uninterrupted``).
for _name in dir(Store):
    _method = inspect.getattr_static(Store, _name)
    if not _name.startswith("_") and inspect.iscoroutinefunction(_method):
        setattr(Store, _name, uninterrupted(_method))
