"""Attachments: uploaded durably (bytes and sha256 in the store) and placed in the session's ``files/``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Response, UploadFile

from fleet_api.deps import State, check_id
from fleet_api.routes._content import content_response
from fleet_api.routes._docs import errors
from fleet_api.routes.sessions import SessionsDep
from fleet_api.schemas import Attachment

router = APIRouter(tags=["attachments"])

UPLOAD_PATH = "/api/attachments"


@router.post(
    "/attachments",
    status_code=201,
    response_model=Attachment,
    responses=errors(404, 413, 507),
    summary="Upload a file into a session's workspace (files/), stored durably with its sha256",
)
async def upload_attachment(
    sessions: SessionsDep,
    file: Annotated[UploadFile, File(description="the file; its name is kept, made safe, never overwrites another")],
    session_id: Annotated[str, Form(description="the session whose workspace receives the file")],
) -> Attachment:
    await sessions.get(check_id(session_id, "session"))  # before reading the body
    data = await file.read(sessions.max_upload_bytes + 1)  # a byte more than allowed is enough to refuse it
    attached = await sessions.attach(session_id, file.filename or "attachment", data, file.content_type)
    return Attachment.model_validate(attached.attachment.to_dict())


@router.get("/attachments/{attachment_id}", response_model=Attachment, responses=errors(404))
async def get_attachment(attachment_id: str, state: State) -> Attachment:
    row = await state.sessions.attachment(check_id(attachment_id, "attachment"))
    return Attachment.model_validate(row.to_dict())


@router.get(
    "/attachments/{attachment_id}/content",
    response_class=Response,
    responses={200: {"description": "the attachment's bytes, with its content type"}, **errors(404)},
)
async def get_attachment_content(attachment_id: str, state: State) -> Response:
    row = await state.sessions.attachment(check_id(attachment_id, "attachment"))
    data = await state.sessions.content(row)
    return content_response(data, mime=row.mime, filename=row.filename, sha256=row.sha256)
