"""A session's workspace over HTTP: read, write, delete and describe its files, never outside it.

Paths are relative to ``/workspace``; none may climb out (``..``), be absolute after its leading ``/``,
or go through a link: every component is opened at a descriptor with ``O_NOFOLLOW`` (``safe_files``),
so a link that sandbox code planted is refused, not followed. Writes wait for no turn: while a turn of
the session runs they are refused (409), since the sandbox hands its copy of the workspace back when
the turn ends and would undo them.
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath

from fleet_kernel import safe_files
from fleet_kernel.config import Settings
from fleet_kernel.errors import ConflictError, NotFoundError, PayloadTooLargeError, ValidationError
from fleet_kernel.store import Store
from fleet_kernel.workspace import Workspace, raise_if_full

MAX_PATH_CHARS = 1024


@dataclass(frozen=True)
class FileStat:
    path: str
    size: int
    sha256: str
    modified_at: str


def clean_path(path: str) -> str:
    """The ``/``-separated path inside the workspace, or ``ValidationError`` (422) for one that leaves it."""
    raw = path.strip().lstrip("/")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts or len(raw) > MAX_PATH_CHARS or "\x00" in raw or any(p == ".." for p in parts):
        raise ValidationError(
            f"{path[:200]!r} is not a file path inside the workspace: use a relative path such as files/data.csv, "
            "without '..'"
        )
    return str(PurePosixPath(*parts))


class WorkspaceFiles:
    """The files of one session's workspace, for the API."""

    def __init__(self, store: Store, settings: Settings, session_id: str) -> None:
        self.store = store
        self.settings = settings
        self.session_id = session_id

    @property
    def max_bytes(self) -> int:
        return int(self.settings.policy.storage.max_upload_mb * 1024 * 1024)

    async def _root(self) -> Workspace:
        await self.store.get_session(self.session_id)  # NotFoundError for an unknown session
        return await asyncio.to_thread(Workspace.for_session, self.settings.workspaces_dir, self.session_id)

    async def _idle(self) -> None:
        running = await self.store.running_turn_id(self.session_id)
        if running:
            raise ConflictError(
                f"turn {running} is running in this session and its sandbox holds the workspace: "
                "wait for it to end (or cancel it), then write again",
                turn_id=running,
                code="session_busy",
            )

    async def open(self, path: str) -> tuple[str, safe_files.OpenFile]:
        """The file opened and hashed, to be streamed in chunks (never held whole); the caller closes it."""
        rel = clean_path(path)
        workspace = await self._root()
        try:
            return rel, await asyncio.to_thread(safe_files.open_path, workspace.root, rel)
        except safe_files.Refused as exc:
            raise NotFoundError(f"no file {rel!r} in the workspace ({exc})") from exc

    async def stat(self, path: str) -> FileStat:
        rel = clean_path(path)
        workspace = await self._root()
        try:
            size, digest, mtime = await asyncio.to_thread(safe_files.stat_path, workspace.root, rel)
        except safe_files.Refused as exc:
            raise NotFoundError(f"no file {rel!r} in the workspace ({exc})") from exc
        moment = datetime.fromtimestamp(mtime, UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
        return FileStat(rel, size, digest, moment)

    async def write(self, path: str, data: bytes) -> FileStat:
        """Create or replace the file (and its folders). Raises 409 while a turn runs, 413 over the limit,
        507 over the workspace quota (``[sandbox] workspace_mb`` / ``workspace_files``) or on a full disk."""
        rel = clean_path(path)
        if len(data) > self.max_bytes:
            raise PayloadTooLargeError(
                f"the file is larger than {self.settings.policy.storage.max_upload_mb:g} MB (storage.max_upload_mb)"
            )
        workspace = await self._root()
        await self._idle()
        await asyncio.to_thread(self._check_room, workspace, rel, len(data))
        try:
            await asyncio.to_thread(safe_files.write_path, workspace.root, rel, data)
        except safe_files.Refused as exc:
            if isinstance(exc.__cause__, OSError):
                raise_if_full(exc.__cause__, workspace.root, f"{rel} was not written")
            raise ValidationError(f"cannot write {rel!r}: {exc}") from exc
        return await self.stat(rel)

    def _check_room(self, workspace: Workspace, rel: str, size: int) -> None:
        parts = rel.split("/")
        try:
            st = os.stat(workspace.root / rel, follow_symlinks=False)
            replacing = st.st_size if stat.S_ISREG(st.st_mode) else 0
        except OSError:
            replacing = 0
        workspace.check_room(self.settings.policy.sandbox, size, workspace.missing_entries(parts), replacing=replacing)

    async def delete(self, path: str) -> None:
        rel = clean_path(path)
        workspace = await self._root()
        await self._idle()
        try:
            removed = await asyncio.to_thread(safe_files.remove_path, workspace.root, rel)
        except safe_files.Refused as exc:
            raise ValidationError(f"cannot delete {rel!r}: {exc}") from exc
        if not removed:
            raise NotFoundError(f"no file {rel!r} in the workspace")
