"""Tables: sessions, turns, events, attachments, artifacts and the blobs that hold their bytes.

Bytes live in the database (``blobs``, keyed by sha256) rather than a folder, so a PostgreSQL store
shared by several machines serves every attachment and artifact from any of them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def utcnow() -> datetime:
    """Now in UTC without a time zone, as times are stored."""
    return datetime.now(UTC).replace(tzinfo=None)


def iso(moment: datetime | None) -> str | None:
    """Render a stored UTC time as ISO 8601 with a ``Z``."""
    if moment is None:
        return None
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=False)}


class SessionRow(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    turn_count: Mapped[int] = mapped_column(Integer, default=0)
    archived: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    model: Mapped[str | None] = mapped_column(String(200))  # this session's root LM, over FLEET_LM_MODEL
    sub_model: Mapped[str | None] = mapped_column(String(200))  # and its sub-LM, over FLEET_SUB_LM_MODEL

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "title": self.title,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "turn_count": self.turn_count,
            "archived": bool(self.archived),
            "model": self.model,
            "sub_model": self.sub_model,
        }


class TurnRow(Base):
    __tablename__ = "turns"
    __table_args__ = (
        Index("uq_turns_session_idempotency", "session_id", "idempotency_key", unique=True),
        # At most one running turn per session, enforced by the database across processes.
        Index(
            "uq_turns_one_running",
            "session_id",
            unique=True,
            sqlite_where=text("status = 'running'"),
            postgresql_where=text("status = 'running'"),
        ),
        Index("ix_turns_status_heartbeat", "status", "heartbeat_at"),
    )

    turn_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), unique=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    task: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    answer: Mapped[str | None] = mapped_column(Text)
    error: Mapped[dict[str, Any] | None]
    usage: Mapped[dict[str, Any] | None]
    result: Mapped[Any | None] = mapped_column(JSON, nullable=True)  # the validated value of an output_schema
    # max_iters | deadline | budget: the answer was extracted from the steps, not submitted by the model
    extraction_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    model: Mapped[str | None] = mapped_column(String(200))
    sandbox: Mapped[str | None] = mapped_column(String(32))
    owner: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime]
    cancel_requested_at: Mapped[datetime | None]
    cancel_reason: Mapped[str | None] = mapped_column(String(200))
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    cell_id: Mapped[str | None] = mapped_column(String(200))  # the notebook cell it ran from (Jupyter's cellId)
    supersedes_turn_id: Mapped[str | None] = mapped_column(String(64))  # the earlier run of its cell it replaces
    forgotten_at: Mapped[datetime | None]  # taken out of the history later turns see (reversible)

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "task": self.task,
            "status": self.status,
            "answer": self.answer,
            "error": self.error,
            "usage": self.usage,
            "result": self.result,
            "extracted": self.extraction_reason is not None,
            "extraction_reason": self.extraction_reason,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
        }


class EventRow(Base):
    __tablename__ = "events"

    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.turn_id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64), index=True)
    type: Mapped[str] = mapped_column(String(32))
    agent_id: Mapped[str] = mapped_column(String(64))
    parent_agent_id: Mapped[str | None] = mapped_column(String(64))
    ts: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]]


class BlobRow(Base):
    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class AttachmentRow(Base):
    __tablename__ = "attachments"

    attachment_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(512))
    mime: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]

    def to_dict(self) -> dict[str, Any]:
        return {
            "attachment_id": self.attachment_id,
            "session_id": self.session_id,
            "filename": self.filename,
            "path": self.path,
            "mime": self.mime,
            "size": self.size,
            "sha256": self.sha256,
            "created_at": iso(self.created_at),
        }


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    artifact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.turn_id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(512))
    mime: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact_id": self.artifact_id,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "path": self.path,
            "mime": self.mime,
            "size": self.size,
            "sha256": self.sha256,
            "created_at": iso(self.created_at),
        }


class MemoryRow(Base):
    """A note the model keeps for its session (``remember``); searched by full text (see ``store.memories``)."""

    __tablename__ = "memories"
    __table_args__ = (Index("ix_memories_session_created", "session_id", "created_at"),)

    memory_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "content": self.content,
            "kind": self.kind,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }


class FeedbackRow(Base):
    """A user's mark on a turn's answer: ``good`` or ``bad``, with a note; one per turn, the latest kept."""

    __tablename__ = "feedback"

    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.turn_id", ondelete="CASCADE"), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    rating: Mapped[str] = mapped_column(String(8))
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "rating": self.rating,
            "note": self.note,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }


class HistorySummaryRow(Base):
    """A session's rolling summary of the turns past its history window (``engine/compaction.py``), with the
    ids of the turns it covers, oldest first: it stands only while they are still the first turns its
    history sees."""

    __tablename__ = "history_summaries"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    covers: Mapped[list[str]] = mapped_column(JSON)
    model: Mapped[str | None] = mapped_column(String(200))  # the sub-model that wrote it
    updated_at: Mapped[datetime]
