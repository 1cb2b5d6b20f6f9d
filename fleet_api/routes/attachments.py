"""Attachments: uploaded durably (bytes and sha256 in the store) and placed in the session's ``files/``."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, File, Form, Response, UploadFile

from fleet_api.deps import State, check_id
from fleet_api.routes._content import content_response
from fleet_api.routes._docs import errors
from fleet_api.schemas import Attachment
from fleet_kernel.errors import PayloadTooLargeError
from fleet_kernel.workspace import Workspace, guess_mime

router = APIRouter(tags=["attachments"])

_MIME = re.compile(r"^[A-Za-z0-9][\w.+-]*/[A-Za-z0-9][\w.+-]*$")
UPLOAD_PATH = "/api/attachments"


def _mime(declared: str | None, path: str) -> str:
    """The client's content type when it is a plain, specific one; else guessed from the name."""
    base = (declared or "").split(";", 1)[0].strip().lower()
    if _MIME.match(base) and base != "application/octet-stream":
        return base
    return guess_mime(path)


@router.post(
    "/attachments",
    status_code=201,
    response_model=Attachment,
    responses=errors(404, 413),
    summary="Upload a file into a session's workspace (files/), stored durably with its sha256",
)
async def upload_attachment(
    state: State,
    file: Annotated[UploadFile, File(description="the file; its name is kept, made safe, never overwrites another")],
    session_id: Annotated[str, Form(description="the session whose workspace receives the file")],
) -> Attachment:
    await state.store.get_session(check_id(session_id, "session"))
    limit = int(state.settings.policy.storage.max_upload_mb * 1024 * 1024)
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLargeError(
            f"the upload is larger than {state.settings.policy.storage.max_upload_mb:g} MB (storage.max_upload_mb)"
        )
    filename = (file.filename or "attachment")[:255]
    workspace = await asyncio.to_thread(Workspace.for_session, state.settings.workspaces_dir, session_id)
    path = await asyncio.to_thread(workspace.add_file, filename, data)
    row = await state.store.add_attachment(
        session_id=session_id, filename=filename, path=path, mime=_mime(file.content_type, path), data=data
    )
    return Attachment.model_validate(row.to_dict())


@router.get("/attachments/{attachment_id}", response_model=Attachment, responses=errors(404))
async def get_attachment(attachment_id: str, state: State) -> Attachment:
    row = await state.store.get_attachment(check_id(attachment_id, "attachment"))
    return Attachment.model_validate(row.to_dict())


@router.get(
    "/attachments/{attachment_id}/content",
    response_class=Response,
    responses={200: {"description": "the attachment's bytes, with its content type"}, **errors(404)},
)
async def get_attachment_content(attachment_id: str, state: State) -> Response:
    row = await state.store.get_attachment(check_id(attachment_id, "attachment"))
    data = await state.store.get_blob(row.sha256)
    return content_response(data, mime=row.mime, filename=row.filename, sha256=row.sha256)
