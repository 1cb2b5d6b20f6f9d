"""A session's memories for the model and the front doors: the host tools, the caps, the Markdown mirror.

The tools (``remember``, ``search_memories``, ``forget``) run on the turn's tool threads and call the
store on the runner's event loop, so every process sees the same memories at once and they outlive the
sandbox. ``memory/MEMORIES.md`` in the workspace mirrors them for people; it is rewritten after each
change made outside a turn and when a turn ends (a sandbox hands its copy of the workspace back then).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from fleet_kernel import safe_files
from fleet_kernel.config import Settings
from fleet_kernel.store import MemoryRow, Store
from fleet_kernel.workspace import MEMORY_FILE, MEMORY_HEADER, Workspace

log = logging.getLogger(__name__)
T = TypeVar("T")
STORE_WAIT_S = 30.0


class Memories:
    """The memories of one session, capped by ``[memory]``."""

    def __init__(self, store: Store, settings: Settings, session_id: str) -> None:
        self.store = store
        self.settings = settings
        self.session_id = session_id
        self.changed = False  # set by a change through the tools: the turn's end then rewrites the mirror

    async def put(self, content: str, kind: str = "note", memory_id: str | None = None) -> MemoryRow:
        caps = self.settings.policy.memory
        row = await self.store.put_memory(
            self.session_id, content, kind=kind, memory_id=memory_id, max_chars=caps.max_chars, max_count=caps.max_count
        )
        return row

    async def search(self, query: str, limit: int = 5) -> list[MemoryRow]:
        return await self.store.search_memories(self.session_id, query, limit)

    async def all(self) -> list[MemoryRow]:
        return await self.store.list_memories(self.session_id)

    async def forget(self, memory_id: str) -> bool:
        return await self.store.forget_memory(self.session_id, memory_id)

    async def listing(self, query: str | None = None) -> list[MemoryRow]:
        """What a front door shows: the search for ``query``, else every memory."""
        return await self.search(query, limit=100) if query and query.strip() else await self.all()

    async def mirror(self) -> None:
        """Rewrite ``memory/MEMORIES.md`` from the store (never through a link code planted)."""
        rows = await self.all()
        workspace = await asyncio.to_thread(Workspace.for_session, self.settings.workspaces_dir, self.session_id)
        try:
            await asyncio.to_thread(write_mirror, workspace.root, rows)
        except safe_files.Refused as exc:  # the store holds the memories; only the readable copy is missing
            log.warning("session %s: %s not rewritten: %s", self.session_id, MEMORY_FILE, exc)

    async def unlisted(self) -> frozenset[str]:
        """The tools a turn's prompt need not describe: ``search_memories`` and ``forget`` while the session
        has no memories (nothing to find or delete; sandbox code can still call them)."""
        return frozenset() if await self.all() else frozenset({"search_memories", "forget"})

    def tools(self, loop: asyncio.AbstractEventLoop) -> list[Callable[..., Any]]:
        """The host tools for sandbox code; they block their tool thread while ``loop`` runs the store call."""

        def call(coro: Awaitable[T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(STORE_WAIT_S)  # type: ignore[arg-type]

        def remember(content: str, kind: str = "note") -> str:
            """Keep `content` for later turns; returns its id."""
            row = call(self.put(content, kind))
            self.changed = True
            return row.memory_id

        def search_memories(query: str, limit: int = 5) -> list[dict[str, Any]]:
            """Memories matching `query` (dicts: memory_id, content, kind)."""
            return [_public(row) for row in call(self.search(query, limit))]

        def forget(memory_id: str) -> bool:
            """Delete a memory."""
            gone = call(self.forget(memory_id))
            self.changed = self.changed or gone
            return gone

        return [remember, search_memories, forget]


def _public(row: MemoryRow) -> dict[str, Any]:
    data = row.to_dict()
    return {key: data[key] for key in ("memory_id", "content", "kind", "created_at")}


def render(rows: list[MemoryRow]) -> str:
    """The Markdown mirror: one section per memory, oldest first."""
    parts = [MEMORY_HEADER]
    if not rows:
        parts.append("\n_No memories yet: code in a turn keeps one with `remember(content)`._\n")
    for row in rows:
        data = row.to_dict()
        parts.append(f"\n## {row.memory_id} ({row.kind}, {data['created_at']})\n\n{row.content.strip()}\n")
    return "".join(parts)


def write_mirror(root: Path, rows: list[MemoryRow]) -> None:
    safe_files.write_path(root, MEMORY_FILE, render(rows).encode("utf-8"))
