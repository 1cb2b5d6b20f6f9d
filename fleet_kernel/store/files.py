"""Files: attachments, artifacts and the blobs holding their bytes (once per sha256)."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleet_kernel.errors import NotFoundError
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import ArtifactRow, AttachmentRow, BlobRow, new_id, utcnow


class FileStore(Repository):
    async def get_blob(self, sha256: str) -> bytes:
        row = await self._read(lambda s: s.get(BlobRow, sha256))
        if row is None:
            raise NotFoundError(f"no content {sha256}")
        return row.data

    async def _add_with_blob(self, row: AttachmentRow | ArtifactRow, data: bytes) -> None:
        """Insert a file's record and its bytes (stored once per sha256) in one transaction."""

        def add(s: Session) -> None:
            if s.get(BlobRow, row.sha256) is None:
                s.add(BlobRow(sha256=row.sha256, size=len(data), data=data))
            s.add(row)

        for attempt in range(2):
            try:
                await self._write(add)
                return
            except IntegrityError:
                if attempt:  # the same bytes were stored concurrently: the second try finds them
                    raise

    async def add_attachment(
        self, *, session_id: str | None, filename: str, path: str, mime: str, data: bytes
    ) -> AttachmentRow:
        row = AttachmentRow(
            attachment_id=new_id("att"), session_id=session_id, filename=filename, path=path, mime=mime,
            **_file_fields(data),
        )  # fmt: skip
        await self._add_with_blob(row, data)
        return row

    async def get_attachment(self, attachment_id: str) -> AttachmentRow:
        return await self._get(AttachmentRow, attachment_id, f"no attachment {attachment_id!r}")

    async def add_artifact(self, *, session_id: str, turn_id: str, path: str, mime: str, data: bytes) -> ArtifactRow:
        row = ArtifactRow(
            artifact_id=new_id("art"), session_id=session_id, turn_id=turn_id, path=path, mime=mime,
            **_file_fields(data),
        )  # fmt: skip
        await self._add_with_blob(row, data)
        return row

    async def get_artifact(self, artifact_id: str) -> ArtifactRow:
        return await self._get(ArtifactRow, artifact_id, f"no artifact {artifact_id!r}")

    async def list_artifacts(self, session_id: str, turn_id: str | None = None) -> list[ArtifactRow]:
        query = select(ArtifactRow).where(ArtifactRow.session_id == session_id)
        if turn_id is not None:
            query = query.where(ArtifactRow.turn_id == turn_id)
        query = query.order_by(ArtifactRow.created_at)
        return await self._read(lambda s: list(s.scalars(query)))

    async def latest_artifact_digests(self, session_id: str) -> dict[str, str]:
        """``{path: sha256}`` of the newest artifact recorded at each path in the session."""
        query = (
            select(ArtifactRow.path, ArtifactRow.sha256)
            .where(ArtifactRow.session_id == session_id)
            .order_by(ArtifactRow.created_at)
        )
        return await self._read(lambda s: {path: sha256 for path, sha256 in s.execute(query)})


def _file_fields(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "created_at": utcnow()}
