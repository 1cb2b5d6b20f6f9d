"""Memories: notes the model keeps for its session, found again by full-text search.

SQLite searches the FTS5 table ``memories_fts`` (kept in step by triggers), PostgreSQL the generated
``tsvector`` column ``memories.search``; both are made by the migration. A query is split into words,
each matched as a prefix, any of them matching, best first.
"""

from __future__ import annotations

import re

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import MemoryRow, new_id, utcnow
from fleet_kernel.store.sessions import session_of

_WORDS = re.compile(r"\w+", re.UNICODE)
_KIND = re.compile(r"[a-z][a-z0-9_-]{0,31}")
MAX_QUERY_WORDS = 32


def check_kind(kind: str) -> str:
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ValidationError(
            f"memory kind {kind!r} is not valid: use a short lowercase word such as 'note', 'fact' or 'preference'"
        )
    return kind


class MemoryStore(Repository):
    async def put_memory(
        self,
        session_id: str,
        content: str,
        *,
        kind: str = "note",
        memory_id: str | None = None,
        max_chars: int,
        max_count: int,
    ) -> MemoryRow:
        """Create a memory (or replace the one with ``memory_id``) in the session.

        Raises:
            ValidationError: empty or over ``max_chars``, a bad kind, or the session holds ``max_count``.
            NotFoundError: unknown session.
        """  # fmt: skip
        if not isinstance(content, str) or not content.strip():
            raise ValidationError("the memory is empty: pass the text to remember")
        if len(content) > max_chars:
            raise ValidationError(
                f"the memory is {len(content)} characters; the limit is {max_chars} (memory.max_chars): keep it shorter"
            )
        check_kind(kind)
        if memory_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", memory_id):
            raise ValidationError(f"memory id {memory_id!r} is not valid: use letters, digits, _ and -, at most 64")
        now = utcnow()

        def put(s: Session) -> MemoryRow:
            session_of(s, session_id)
            row = s.get(MemoryRow, memory_id) if memory_id is not None else None
            if row is not None and row.session_id != session_id:
                raise ValidationError(f"memory id {memory_id!r} is taken by another session: choose another")
            if row is None:
                count = s.scalar(select(func.count()).where(MemoryRow.session_id == session_id))
                if (count or 0) >= max_count:
                    raise ValidationError(
                        f"this session keeps {count} memories, the limit (memory.max_count): forget some first"
                    )
                row = MemoryRow(
                    memory_id=memory_id or new_id("mem"),
                    session_id=session_id,
                    kind=kind,
                    content=content,
                    created_at=now,
                    updated_at=now,
                )
                s.add(row)
            else:
                row.content, row.kind, row.updated_at = content, kind, now
            return row

        return await self._write(put)

    async def get_memory(self, session_id: str, memory_id: str) -> MemoryRow:
        row = await self._read(lambda s: s.get(MemoryRow, memory_id))
        if row is None or row.session_id != session_id:
            raise NotFoundError(f"no memory {memory_id!r} in session {session_id!r}")
        return row

    async def forget_memory(self, session_id: str, memory_id: str) -> bool:
        """Delete one memory of the session; false if it has none with that id."""
        query = (
            delete(MemoryRow)
            .where(MemoryRow.session_id == session_id, MemoryRow.memory_id == memory_id)
            .returning(MemoryRow.memory_id)
        )
        return await self._write(lambda s: s.scalar(query)) is not None

    async def list_memories(self, session_id: str) -> list[MemoryRow]:
        """Every memory of the session, oldest first."""
        query = (
            select(MemoryRow)
            .where(MemoryRow.session_id == session_id)
            .order_by(MemoryRow.created_at, MemoryRow.memory_id)
        )
        return await self._read(lambda s: list(s.scalars(query)))

    async def search_memories(self, session_id: str, query: str, limit: int = 5) -> list[MemoryRow]:
        """The session's memories matching any word of ``query`` (as a prefix), best match first."""
        words = _WORDS.findall(query or "")[:MAX_QUERY_WORDS]
        limit = max(1, min(int(limit), 100))
        if not words:
            return []
        params = {"sid": session_id, "n": limit}
        if self.sqlite:
            params["q"] = " OR ".join('"' + w.replace('"', "") + '"*' for w in words)
            sql = text(
                "SELECT memory_id FROM memories_fts WHERE memories_fts MATCH :q AND session_id = :sid "
                "ORDER BY bm25(memories_fts) LIMIT :n"
            )
        else:
            params["q"] = " | ".join(w.replace("'", "") + ":*" for w in words)
            sql = text(
                "SELECT memory_id FROM memories WHERE session_id = :sid "
                "AND search @@ to_tsquery('simple', :q) "
                "ORDER BY ts_rank(search, to_tsquery('simple', :q)) DESC, created_at DESC LIMIT :n"
            )

        def search(s: Session) -> list[MemoryRow]:
            ids = list(s.scalars(sql, params))
            if not ids:
                return []
            rows = {r.memory_id: r for r in s.scalars(select(MemoryRow).where(MemoryRow.memory_id.in_(ids)))}
            return [rows[i] for i in ids if i in rows]

        return await self._read(search)
