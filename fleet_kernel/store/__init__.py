"""The durable store: one ``Store`` over one engine, its methods named for what they do.

Composed of one repository per concern over the connection (``connection.Database``: engines, SQLite
tuning, health): ``sessions``, ``turns`` (claims, reads, the history a turn sees), ``leases`` (owners,
heartbeats, cancellation, ending abandoned turns), ``event_log`` (every turn's events), ``files``
(attachments, artifacts, blobs), ``memories``, ``feedback`` and ``summaries`` (history summaries).
Every process that runs or watches turns opens its own ``Store`` on the same URL.
The store writes no event itself: the engine's one writer does (see ``leases``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fleet_kernel.store.connection import Database, describe_write_error, is_disk_full, through
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
from fleet_kernel.store.sessions import SessionStore
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


class Store(Database):
    """Sessions, turns, events, attachments, artifacts, blobs, memories, feedback and history summaries over
    one async engine: composed from one repository per concern, each public method served by its
    repository's and run to completion once started (``uninterrupted``)."""

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self.sessions = SessionStore(self)
        self.turns = TurnStore(self)
        self.leases = LeaseStore(self)
        self.events = EventLog(self)
        self.files = FileStore(self)
        self.memories = MemoryStore(self)
        self.feedback = FeedbackStore(self)
        self.summaries = SummaryStore(self)

    # sessions: ``SessionStore``
    create_session = through("sessions", SessionStore.create_session)
    get_session = through("sessions", SessionStore.get_session)
    list_sessions = through("sessions", SessionStore.list_sessions)
    page_sessions = through("sessions", SessionStore.page_sessions)
    update_session = through("sessions", SessionStore.update_session)
    running_turn_id = through("sessions", SessionStore.running_turn_id)
    rename_session = through("sessions", SessionStore.rename_session)
    delete_session = through("sessions", SessionStore.delete_session)

    # turns: ``TurnStore``
    claim_turn = through("turns", TurnStore.claim_turn)
    get_turn = through("turns", TurnStore.get_turn)
    list_turns = through("turns", TurnStore.list_turns)
    lineage = through("turns", TurnStore.lineage)
    history = through("turns", TurnStore.history)
    standing_turns = through("turns", TurnStore.standing_turns)
    set_in_history = through("turns", TurnStore.set_in_history)

    # leases: ``LeaseStore``
    beat = through("leases", LeaseStore.beat)
    cancel_requests = through("leases", LeaseStore.cancel_requests)
    request_cancel = through("leases", LeaseStore.request_cancel)
    reap_stale_turns = through("leases", LeaseStore.reap_stale_turns)
    fail_turn = through("leases", LeaseStore.fail_turn)

    # events: ``EventLog``
    append_events = through("events", EventLog.append_events)
    finish_turn = through("events", EventLog.finish_turn)

    def event_notifications(self, on_commit: Callable[[], None]) -> AbstractAsyncContextManager[bool]:
        """``EventLog.event_notifications``."""
        return self.events.event_notifications(on_commit)

    events_after = through("events", EventLog.events_after)
    events_after_many = through("events", EventLog.events_after_many)
    session_events = through("events", EventLog.session_events)
    count_events = through("events", EventLog.count_events)

    # files: ``FileStore``
    get_blob = through("files", FileStore.get_blob)
    add_attachment = through("files", FileStore.add_attachment)
    get_attachment = through("files", FileStore.get_attachment)
    add_artifact = through("files", FileStore.add_artifact)
    get_artifact = through("files", FileStore.get_artifact)
    list_artifacts = through("files", FileStore.list_artifacts)
    latest_artifact_digests = through("files", FileStore.latest_artifact_digests)

    # memories: ``MemoryStore``
    put_memory = through("memories", MemoryStore.put_memory)
    get_memory = through("memories", MemoryStore.get_memory)
    forget_memory = through("memories", MemoryStore.forget_memory)
    list_memories = through("memories", MemoryStore.list_memories)
    search_memories = through("memories", MemoryStore.search_memories)

    # feedback: ``FeedbackStore``
    put_feedback = through("feedback", FeedbackStore.put_feedback)
    get_feedback = through("feedback", FeedbackStore.get_feedback)
    list_feedback = through("feedback", FeedbackStore.list_feedback)

    # summaries: ``SummaryStore``
    history_read = through("summaries", SummaryStore.history_read)
    turns_in_order = through("summaries", SummaryStore.turns_in_order)
    history_summary = through("summaries", SummaryStore.history_summary)
    put_history_summary = through("summaries", SummaryStore.put_history_summary)
