"""``Sessions``: what a session is beyond its row, for both front doors.

A session is a store row with its turns, events, attachments and artifacts, plus a workspace folder
(``$FLEET_HOME/workspaces/<session_id>``) and whatever the sandbox backend keeps for it (Daytona: a warm
sandbox). The kernel's ``%fleet`` commands and the API's routes parse their input and render the answer;
creating, choosing models, attaching, reading turns and files, forgetting and restoring turns, memories
(with their ``MEMORIES.md`` mirror), feedback, usage, durable cancellation, deleting and exporting happen
here, once, so the two front doors cannot drift apart. Neither calls the store itself.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_kernel import sandbox
from fleet_kernel.config import Settings
from fleet_kernel.engine.compaction import HistoryPlan, plan_history
from fleet_kernel.engine.memory import Memories
from fleet_kernel.engine.session_config import check_model, effective_config, session_settings
from fleet_kernel.errors import InsufficientStorageError, NotFoundError, PayloadTooLargeError, ValidationError
from fleet_kernel.events import Event
from fleet_kernel.store import (
    ArtifactRow,
    AttachmentRow,
    FeedbackRow,
    MemoryRow,
    SessionRow,
    Store,
    TurnRow,
    is_disk_full,
)
from fleet_kernel.store.cells import Lineage
from fleet_kernel.store.sessions import Archived, SessionPage
from fleet_kernel.transcript import notebook_filename, session_notebook
from fleet_kernel.workspace import Workspace, disk_full_message, guess_mime, raise_if_full, safe_filename

if TYPE_CHECKING:
    import nbformat

log = logging.getLogger(__name__)

_MIME = re.compile(r"^[A-Za-z0-9][\w.+-]*/[A-Za-z0-9][\w.+-]*$")
MAX_FILENAME_CHARS = 255


@dataclass(frozen=True)
class Attached:
    """An attachment and the name it was asked for: ``renamed`` when ``files/`` held another file of that name."""

    attachment: AttachmentRow
    renamed: bool


@dataclass(frozen=True)
class Usage:
    """What a session's turns used: how many ended in each status, the LM calls, tokens and cost of them all,
    and the usage of the last turn that recorded one (with its budgets)."""

    turns: int
    statuses: dict[str, int]
    totals: dict[str, Any]
    last: dict[str, Any] | None


@dataclass(frozen=True)
class Export:
    """A session as a notebook, with the file name it is offered under (``fleet-<title>-<id>.ipynb``)."""

    filename: str
    notebook: nbformat.NotebookNode

    @property
    def turns(self) -> int:
        return sum(cell.cell_type == "code" for cell in self.notebook.cells)

    def text(self) -> str:
        import nbformat  # noqa: PLC0415 - slow to import; only exports need it

        text: str = nbformat.writes(self.notebook)
        return text

    def write(self, target: Path) -> Path:
        """Write to ``target``: a ``.ipynb`` file, or a folder that gets ``filename``. Returns the file."""
        import nbformat  # noqa: PLC0415 - slow to import (~2 s); only exports need it

        if not target.name.endswith(".ipynb"):
            target = target / self.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(self.notebook, str(target))
        return target


class Sessions:
    """Create, find, rename, attach to, delete and export sessions over one store and its settings."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    async def create(self, title: str = "", session_id: str | None = None) -> SessionRow:
        return await self.store.create_session(title, session_id)

    async def get(self, session_id: str) -> SessionRow:
        """Raises ``NotFoundError``."""
        return await self.store.get_session(session_id)

    async def list(self, limit: int = 200) -> Sequence[SessionRow]:
        """The most recently updated first."""
        return await self.store.list_sessions(limit=limit)

    async def rename(self, session_id: str, title: str) -> SessionRow:
        """Raises ``NotFoundError``."""
        return await self.store.rename_session(session_id, title)

    async def page(
        self, *, limit: int = 200, cursor: str | None = None, q: str | None = None, archived: Archived = "false"
    ) -> SessionPage:
        """Newest first, ``limit`` at a time; see ``Store.page_sessions``. Raises ``ValidationError``."""
        return await self.store.page_sessions(limit=limit, cursor=cursor, q=q, archived=archived)

    async def update(self, session_id: str, changes: dict[str, Any]) -> SessionRow:
        """Apply ``title``, ``archived``, ``model`` and ``sub_model`` (``None`` model: the configured one).

        Raises:
            ValidationError: nothing to change, a null title or archived flag, an unknown field, or a model
                the operator did not allow (``session_config.check_model``).
            NotFoundError: unknown session.
        """
        if not changes:
            raise ValidationError("nothing to change: send title, archived, model or sub_model")
        unknown = set(changes) - {"title", "archived", "model", "sub_model"}
        if unknown:
            raise ValidationError(f"unknown session fields: {', '.join(sorted(unknown))}")
        for key in ("title", "archived"):
            if key in changes and changes[key] is None:
                raise ValidationError(f"{key} cannot be null")
        for key in ("model", "sub_model"):
            if isinstance(changes.get(key), str):
                check_model(changes[key], self.settings)
        return await self.store.update_session(session_id, **changes)

    async def config(self, session_id: str, sandbox_name: str) -> dict[str, Any]:
        """The settings a turn of the session would use now (``session_config.effective_config``)."""
        return effective_config(self.settings, await self.store.get_session(session_id), sandbox_name)

    async def settings_for(self, session_id: str) -> Settings:
        """These settings with the session's own models (``session_config.session_settings``).

        Raises ``NotFoundError``."""
        return session_settings(self.settings, await self.store.get_session(session_id))

    async def choose_model(self, session_id: str, model: str) -> SessionRow:
        """Record ``model`` as the session's root model, which the caller has checked (the kernel's
        ``choose_model`` lets its user pick a replay file of their own); both front doors then show it."""
        return await self.store.update_session(session_id, model=model)

    # ------------------------------------------------------------------ turns and history

    async def turns(self, session_id: str) -> Sequence[TurnRow]:
        """The session's turns in the order they started. Raises ``NotFoundError``."""
        return await self.store.list_turns(session_id)

    async def turn(self, session_id: str | None, turn_id: str) -> TurnRow:
        """Raises ``NotFoundError`` (no such turn in the session; ``None``: in any session)."""
        return await self.store.get_turn(turn_id, session_id)

    async def lineage(self, session_id: str) -> Lineage:
        """The cells of the session's turns: which turn re-ran which, and which the history sees."""
        return await self.store.lineage(session_id)

    async def events(self, turn_id: str) -> builtins.list[Event]:
        """Every stored event of the turn, in order."""
        events: list[Event] = []
        while page := await self.store.events_after(turn_id, events[-1].seq if events else 0):
            events.extend(page)
        return events

    async def keep_in_history(self, session_id: str, turn_id: str, keep: bool) -> TurnRow:
        """Forget a turn (later turns do not see it) or restore it (``Store.set_in_history``).

        Raises:
            NotFoundError: no such turn in the session.
            ConflictError: restoring a turn that still would not be seen, with the reason.
        """
        return await self.store.set_in_history(session_id, turn_id, keep)

    async def history(self, session_id: str) -> HistoryPlan:
        """What the session's next turn sees of earlier turns (``compaction.plan_history``)."""
        return await plan_history(self.store, session_id, await self.settings_for(session_id))

    async def forgotten(self, session_id: str) -> Sequence[TurnRow]:
        """The turns taken out of the history, in the order they started."""
        return [turn for turn in await self.turns(session_id) if turn.forgotten_at is not None]

    async def usage(self, session_id: str) -> Usage:
        """What the session's turns used. Raises ``NotFoundError``."""
        turns = await self.turns(session_id)
        totals: dict[str, Any] = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
        for turn in turns:
            for key in totals:
                totals[key] += (turn.usage or {}).get(key) or 0
        statuses = {status: sum(t.status == status for t in turns) for status in sorted({t.status for t in turns})}
        finished = [t.usage for t in turns if t.usage]
        return Usage(len(turns), statuses, totals, finished[-1] if finished else None)

    async def request_cancel(self, run_id: str, reason: str) -> tuple[TurnRow, str]:
        """Record a durable cancellation, honoured by whichever process runs the turn; returns the turn and
        ``requested|already_requested|already_terminal``. Raises ``NotFoundError`` (code ``run_not_found``)."""
        return await self.store.request_cancel(run_id, reason)

    # ------------------------------------------------------------------ memories and feedback

    async def memories(self, session_id: str) -> Memories:
        """The session's memories. Raises ``NotFoundError`` for an unknown session."""
        await self.store.get_session(session_id)
        return Memories(self.store, self.settings, session_id)

    async def remember(self, session_id: str, content: str, kind: str, memory_id: str | None = None) -> MemoryRow:
        """Create or replace a memory and rewrite the session's ``MEMORIES.md``. Raises ``NotFoundError``."""
        memories = await self.memories(session_id)
        row = await memories.put(content, kind, memory_id=memory_id)
        await memories.mirror()
        return row

    async def forget_memory(self, session_id: str, memory_id: str) -> bool:
        """Delete a memory and rewrite ``MEMORIES.md``; false (nothing rewritten) when the session has none
        with that id. Raises ``NotFoundError`` for an unknown session."""
        memories = await self.memories(session_id)
        if not await memories.forget(memory_id):
            return False
        await memories.mirror()
        return True

    async def memory(self, session_id: str, memory_id: str) -> MemoryRow:
        """Raises ``NotFoundError``."""
        return await self.store.get_memory(session_id, memory_id)

    async def feedback(self, session_id: str, turn_id: str) -> FeedbackRow:
        """The turn's latest mark. Raises ``NotFoundError`` when it has none."""
        return await self.store.get_feedback(session_id, turn_id)

    # ------------------------------------------------------------------ files

    async def attachment(self, attachment_id: str) -> AttachmentRow:
        """Raises ``NotFoundError``."""
        return await self.store.get_attachment(attachment_id)

    async def artifact(self, artifact_id: str) -> ArtifactRow:
        """Raises ``NotFoundError``."""
        return await self.store.get_artifact(artifact_id)

    async def content(self, row: AttachmentRow | ArtifactRow) -> bytes:
        """The stored bytes of an attachment or artifact (by its sha256)."""
        return await self.store.get_blob(row.sha256)

    # ------------------------------------------------------------------ attachments

    @property
    def max_upload_bytes(self) -> int:
        """The largest attachment (``storage.max_upload_mb``)."""
        return int(self.settings.policy.storage.max_upload_mb * 1024 * 1024)

    async def attach(self, session_id: str, filename: str, data: bytes, content_type: str | None = None) -> Attached:
        """Put ``data`` in the session's ``files/`` and keep it durably (bytes and sha256 in the store).

        The name is made safe; a different file of that name is never overwritten (the new one is
        ``name-2.ext``, ...), the same bytes under the same name are the same file. ``content_type`` is
        kept when it is a plain, specific one, else the type is guessed from the name.

        A new file must fit the workspace quota (``[sandbox] workspace_mb`` / ``workspace_files``); when
        the disk is full (the workspace's or the store's) nothing of it is kept.

        Raises:
            NotFoundError: unknown session.
            PayloadTooLargeError: ``data`` is larger than ``storage.max_upload_mb``.
            InsufficientStorageError: over the workspace quota, or a full disk.
        """
        filename = filename[:MAX_FILENAME_CHARS] or "attachment"
        await self.store.get_session(session_id)
        if len(data) > self.max_upload_bytes:
            raise PayloadTooLargeError(f"{filename} is larger than {self._limit_text()}")
        workspace = await asyncio.to_thread(self._workspace, session_id)
        quota = self.settings.policy.sandbox
        path, created = await asyncio.to_thread(workspace.place_file, filename, data, quota)
        try:
            row = await self.store.add_attachment(
                session_id=session_id, filename=filename, path=path, mime=_mime(content_type, path), data=data
            )
        except Exception as exc:
            if created:  # the upload failed: its copy in the workspace goes too
                await asyncio.to_thread((workspace.root / path).unlink, missing_ok=True)
            if is_disk_full(exc):
                where = Path(self.store.sqlite_file) if self.store.sqlite_file else None
                what = f"{filename} was not stored"
                message = disk_full_message(where, what) if where else f"the store is full: {what}"
                raise InsufficientStorageError(message) from exc
            raise
        return Attached(row, renamed=Path(path).name != safe_filename(filename))

    def _workspace(self, session_id: str) -> Workspace:
        try:
            return Workspace.for_session(self.settings.workspaces_dir, session_id)
        except OSError as exc:  # a new workspace's folders and memory file could not be made
            raise_if_full(exc, self.settings.workspaces_dir, "the session's workspace was not made")
            raise

    async def read_file(self, source: Path) -> bytes:
        """A local file's bytes for ``attach``, checked first so a bad path never starts anything.

        Raises:
            NotFoundError: no such file.
            PayloadTooLargeError: the file is larger than ``storage.max_upload_mb`` (it is not read).
        """

        def read() -> bytes:  # on a thread: a slow disk or a network mount never stalls the event loop
            if not source.is_file():
                raise NotFoundError(f"no file {source} (paths are relative to {Path.cwd()})")
            if source.stat().st_size > self.max_upload_bytes:
                raise PayloadTooLargeError(f"{source.name} is larger than {self._limit_text()}")
            return source.read_bytes()

        return await asyncio.to_thread(read)

    def _limit_text(self) -> str:
        return f"storage.max_upload_mb ({self.settings.policy.storage.max_upload_mb:g} MB)"

    # ------------------------------------------------------------------ delete and export

    async def delete(self, session_id: str) -> tuple[str, ...]:
        """Delete the session with its turns, events, attachments, artifacts, workspace and sandbox.

        Returns the ids of the turns it had (a front door may hold things of its own for them).

        Raises:
            NotFoundError: unknown session.
            ConflictError: a turn is running in it (cancel it first).
        """
        turns = await self.store.list_turns(session_id)
        await self.store.delete_session(session_id)
        await asyncio.to_thread(shutil.rmtree, self.settings.workspaces_dir / session_id, ignore_errors=True)
        await self._forget_sandbox(session_id)
        return tuple(turn.turn_id for turn in turns)

    async def _forget_sandbox(self, session_id: str) -> None:
        """The backend drops what it keeps for the session (Daytona: its warm sandbox, which also auto-deletes)."""
        try:
            await asyncio.to_thread(sandbox.forget, self.settings, session_id)
        except Exception as exc:  # noqa: BLE001 - the session is deleted already; say so rather than fail
            log.warning(
                "could not delete the sandbox of session %s (Daytona deletes it after it stops): %s",
                session_id,
                getattr(exc, "message", exc),
            )

    async def export(self, session_id: str) -> Export:
        """The session as an nbformat 4 notebook for the ``fleet`` kernel, one cell per turn.

        Raises:
            NotFoundError: unknown session.
        """
        session = await self.store.get_session(session_id)
        return Export(notebook_filename(session), await session_notebook(self.store, session_id))


def _mime(declared: str | None, path: str) -> str:
    """The declared content type when it is a plain, specific one; else guessed from the name."""
    base = (declared or "").split(";", 1)[0].strip().lower()
    if _MIME.match(base) and base != "application/octet-stream":
        return base
    return guess_mime(path)
