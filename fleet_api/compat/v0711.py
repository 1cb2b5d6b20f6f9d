"""fleet-rlm 0.7.11's HTTP + SSE contract (paths under ``/api``) over Fleet's engine and store.

The second version of the fleet-rlm profile, under the same prefix as 0.8.1's
(``fleet_api.compat.routes``), whose stream core, session helpers and error-rendering route class it
reuses: what differs is the vocabulary (``text``, ``id``, ``items``/``total``), the error envelope
(``{code, message}`` with the reference's closed codes), the stream's framing (named chunks and a
final ``data: [DONE]``) and a required ``Idempotency-Key``. Bodies and chunks come from
``fleet_api.compat.wire``.

As the reference: sessions are created by ``POST /api/sessions`` (not on first use); a turn that
cannot open (unknown session, a running turn, a key of another task) is a ``turn_error`` inside the
200 stream; closing the stream cancels the turn; an upload over the limit is 400. Uploads belong to
no session until a turn names them, when they are placed in that session's ``files/``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Header, Query, Request, Response, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import Field, StrictBool, model_validator

from fleet_api.compat import wire
from fleet_api.compat.routes import PREFIX, _Request, _sessions, reference_route, turn_frames
from fleet_api.deps import ID_PATTERN, FleetState, State
from fleet_api.routes._content import content_response
from fleet_api.sse import event_stream
from fleet_api.volume import MAX_DEPTH, MAX_ENTRIES, list_tree
from fleet_kernel import __version__
from fleet_kernel.errors import ConflictError, FleetError, NotFoundError, ValidationError
from fleet_kernel.events import Event
from fleet_kernel.skills import Skill, catalogue_for
from fleet_kernel.store import TurnRow

API = "/api"
ATTACH_PATH = rf"^{PREFIX}{API}/attachments$"
MOUNT = PurePosixPath("/workspace")  # the volume's mount, as the reference's clients name paths in it
MAX_LISTED_SESSIONS = 10_000
METHODS = ["GET", "PUT", "POST", "PATCH", "DELETE"]
CANCEL_REASON = "cancelled over HTTP (fleet-rlm 0.7.11 profile: PUT /api/runs/{run_id}/cancellation)"


class ReferenceError(FleetError):
    """An error in 0.7.11's closed vocabulary: its status, ``code`` and ``message`` as the reference sends them."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code, status=status)


def _oversize(message: str) -> JSONResponse:
    return JSONResponse(wire.coded_error("attachment_invalid", message), status_code=400)


def render_error(exc: FleetError | RequestValidationError, request: Request | None = None) -> JSONResponse:
    """0.7.11's ``{code, message}``: a route's own code, else the reference's default for the status
    (with Fleet's message, which says what to do); 413 is the reference's 400 (``attachment_invalid`` on
    the upload route), anything else 503."""
    if isinstance(exc, RequestValidationError):
        skills = any("skill_selections" in map(str, e.get("loc", ())) for e in exc.errors())
        body = wire.coded_error("invalid_skill_selection", "Invalid Skill selection") if skills else None
        return JSONResponse(body or wire.coded_error("invalid_request", "Invalid request"), status_code=422)
    if isinstance(exc, ReferenceError):
        return JSONResponse(wire.coded_error(exc.code, exc.message), status_code=exc.status)
    if exc.status == 413 and request is not None and re.match(ATTACH_PATH, request.url.path):
        return _oversize(exc.message)
    status = 400 if exc.status == 413 else exc.status if exc.status in wire.DEFAULT_CODES else 503
    if isinstance(exc, ValidationError):
        status = 422
    code, _message = wire.DEFAULT_CODES[status]
    return JSONResponse(wire.coded_error(code, exc.message), status_code=status)


OVERSIZE = (re.compile(ATTACH_PATH), _oversize)
"""For ``BodyLimit``: an upload declared larger than the limit is 0.7.11's 400, not Fleet's 413."""

router = APIRouter(prefix=PREFIX, route_class=reference_route(render_error))
"""Mounted beside 0.8.1's router (``include_in_schema=False``); its own document is ``{PREFIX}/api/openapi.json``."""


def _not_found(code: str, message: str) -> ReferenceError:
    return ReferenceError(404, code, message)


async def _session(state: FleetState, session_id: str) -> Any:
    """The session, or the reference's 404 ``session_not_found``."""
    if not ID_PATTERN.match(session_id):
        raise _not_found("session_not_found", "Session not found")
    try:
        return await state.store.get_session(session_id)
    except NotFoundError:
        raise _not_found("session_not_found", "Session not found") from None


# ---------------------------------------------------------------------- health, settings, skills


@router.get("/health/ready")
async def readiness(state: State) -> dict[str, Any]:
    """0.7.11's readiness probe (its liveness, ``GET /health``, is the route 0.8.1 shares)."""
    if await state.store_problem() is not None:
        raise ReferenceError(503, "service_not_ready", "Service is not ready")
    return {"status": "ready", "database": "ok"}


def _settings_fields(state: FleetState) -> list[dict[str, Any]]:
    s = state.settings
    limits = s.policy.limits
    values: list[tuple[str, str, str, Any, str]] = [
        ("llm.model", "llm", "Root model", s.lm_model or "", "text"),
        ("llm.sub_model", "llm", "Sub model", s.sub_lm_model or "", "text"),
        ("limits.max_iters", "runtime", "Iterations per turn", limits.max_iters, "number"),
        ("limits.max_llm_calls", "runtime", "LM calls per turn", limits.max_llm_calls, "number"),
        ("limits.max_depth", "runtime", "Child agent depth", limits.max_depth, "number"),
        ("limits.turn_timeout_s", "runtime", "Turn timeout (seconds)", limits.turn_timeout_s, "number"),
    ]
    return [
        {"path": p, "group": g, "label": label, "value": v, "editor": e, "choices": [], "environment_overridden": False}
        for p, g, label, v, e in values
    ]


@router.get(f"{API}/settings")
async def settings_policy(state: State) -> dict[str, Any]:
    """Fleet's main non-secret settings, read-only (they come from ``fleet.toml`` and the environment)."""
    fields = _settings_fields(state)
    revision = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return {"revision": revision, "restart_required": True, "fields": fields}


@router.patch(f"{API}/settings")
async def update_settings_policy(state: State) -> dict[str, Any]:
    raise ReferenceError(
        422, "settings_policy_invalid", "Changing settings over HTTP is not supported by this server: edit fleet.toml"
    )


async def _skills(state: FleetState) -> list[Skill]:
    return list(await asyncio.to_thread(catalogue_for, state.settings))


def _card(skill: Skill) -> dict[str, Any]:
    return wire.skill_card(skill.name, skill.description, skill.body, skill.source, bool(skill.resources))


@router.get(f"{API}/skills")
async def list_skills(state: State, q: str | None = None) -> list[dict[str, Any]]:
    """Fleet's skill cards, ranked by how many words of ``q`` they contain (as the reference)."""
    skills = await _skills(state)
    terms = list(dict.fromkeys((q or "").strip().lower().split()))
    if terms:
        skills.sort(key=lambda s: (-sum(t in f"{s.name} {s.description}".lower() for t in terms), s.name))
    return [_card(s) for s in skills]


@router.get(f"{API}/skills/{{skill_id}}")
async def get_skill(skill_id: str, state: State) -> dict[str, Any]:
    for skill in await _skills(state):
        if str(wire.skill_id(skill.name)) == skill_id:
            return _card(skill)
    raise _not_found("skill_not_found", "Skill not found")


# ---------------------------------------------------------------------- sessions and history


class SessionCreate(_Request):
    title: str | None = Field(default=None, max_length=255)


class SessionPatch(_Request):
    title: str | None = Field(default=None, max_length=255)
    status: Literal["active", "archived"] | None = None


@router.post(f"{API}/sessions", status_code=201)
async def create_session(body: SessionCreate, state: State) -> dict[str, Any]:
    """A new session under a UUID (the reference's ids are UUIDs; Fleet's own ``ses_…`` ids work too)."""
    title = (body.title or "New Session").strip() or "New Session"
    row = await _sessions(state).create(title[:255], str(uuid.uuid4()))
    return wire.session_detail(row)


@router.get(f"{API}/sessions")
async def list_sessions(
    state: State,
    status: Literal["active", "archived"] | None = None,
    search: str | None = Query(None, max_length=200),
    limit: int = Query(20, ge=1, le=100),
    offset: int = Query(0, ge=0),
) -> dict[str, Any]:
    rows = await state.store.list_sessions(MAX_LISTED_SESSIONS)
    if status is not None:
        rows = [r for r in rows if r.archived == (status == "archived")]
    if search:
        rows = [r for r in rows if search.lower() in (r.title or "").lower()]
    page = rows[offset : offset + limit]
    return {
        "items": [wire.session_detail(r) for r in page],
        "total": len(rows),
        "offset": offset,
        "limit": limit,
        "has_more": offset + len(page) < len(rows),
    }


@router.get(f"{API}/sessions/{{session_id}}")
async def get_session(session_id: str, state: State) -> dict[str, Any]:
    return wire.session_detail(await _session(state, session_id))


@router.patch(f"{API}/sessions/{{session_id}}")
async def patch_session(session_id: str, body: SessionPatch, state: State) -> dict[str, Any]:
    if body.title is None and body.status is None:
        raise ReferenceError(422, "session_no_fields", "No fields to update")
    if body.title is not None and not body.title.strip():
        raise ReferenceError(422, "session_title_empty", "Title must not be empty")
    await _session(state, session_id)
    archived = None if body.status is None else body.status == "archived"
    title = body.title.strip() if body.title is not None else None
    return wire.session_detail(await state.store.update_session(session_id, title=title, archived=archived))


@router.get(f"{API}/sessions/{{session_id}}/task")
async def get_session_task(session_id: str, state: State) -> dict[str, Any]:
    """Fleet keeps no task checkpoint (goal, decisions, pending work): the reference's answer when it has none."""
    await _session(state, session_id)
    raise _not_found("task_not_found", "Task checkpoint not found")


async def _events(state: FleetState, turn_id: str) -> list[Event]:
    events: list[Event] = []
    while page := await state.store.events_after(turn_id, events[-1].seq if events else 0):
        events.extend(page)
    return events


def _attachment_ids(events: list[Event]) -> list[str]:
    started = next((e for e in events if e.type == "turn.started"), None)
    return [a["attachment_id"] for a in started.data.get("attachments", [])] if started else []


@router.get(f"{API}/sessions/{{session_id}}/turns")
async def list_session_turns(
    session_id: str,
    state: State,
    limit: int = Query(50, ge=1, le=200),
    after_sequence: int | None = Query(None, ge=0),
) -> dict[str, Any]:
    """The committed (completed) turns as UIMessages: the task (sequence ``2n-1``), then the answer (``2n``)."""
    await _session(state, session_id)
    after = after_sequence or 0
    turns = [t for t in await state.store.list_turns(session_id) if t.status == "completed" and 2 * t.position > after]
    items: list[dict[str, Any]] = []
    more = False
    for turn in turns:
        events = await _events(state, turn.turn_id)
        for message in (wire.user_message(turn, _attachment_ids(events)), wire.assistant_message(turn, events)):
            if message["metadata"]["sequence"] <= after:
                continue
            if len(items) == limit:
                more = True
                break
            items.append(message)
        if more:
            break
    return {"items": items, "next_after_sequence": items[-1]["metadata"]["sequence"] if more else None}


class FeedbackRequest(_Request):
    trace_id: str = Field(min_length=1, max_length=256)
    value: StrictBool
    comment: str | None = Field(default=None, max_length=2_000)


@router.post(f"{API}/sessions/{{session_id}}/traces/feedback")
async def submit_feedback(session_id: str, body: FeedbackRequest, state: State) -> dict[str, Any]:
    """A turn's trace id is its ``turn_id`` (``traceId`` in the stream): thumbs up/down is Fleet's good/bad."""
    missing = _not_found("feedback_trace_not_found", "Trace not found")
    if not ID_PATTERN.match(session_id) or not ID_PATTERN.match(body.trace_id):
        raise missing
    try:
        await state.store.put_feedback(session_id, body.trace_id, "good" if body.value else "bad", body.comment or "")
    except NotFoundError:
        raise missing from None
    return {"trace_id": body.trace_id, "name": "user_feedback", "value": body.value, "assessment_id": None}


# ---------------------------------------------------------------------- turns and cancellation


class SkillSelection(_Request):
    id: uuid.UUID
    expected_version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


class TurnRequest(_Request):
    text: str = Field(min_length=1, max_length=100_000)
    attachment_ids: list[str] = Field(default_factory=list, max_length=32)
    skill_selections: list[SkillSelection] = Field(default_factory=list, max_length=4)

    @model_validator(mode="after")
    def _canonical(self) -> TurnRequest:
        if not self.text.strip():
            raise ValueError("text must contain a non-whitespace character")
        if len(set(self.attachment_ids)) != len(self.attachment_ids):
            raise ValueError("attachment_ids must not contain duplicates")
        if len({s.id for s in self.skill_selections}) != len(self.skill_selections):
            raise ValueError("skill_selections must not contain duplicate ids")
        return self


class OpenFailure(Exception):
    """Why a turn could not open, in the reference's closed words (sent inside the stream)."""


async def _skill_names(state: FleetState, selections: list[SkillSelection]) -> list[str]:
    cards = {wire.skill_id(s.name): _card(s) for s in await _skills(state)} if selections else {}
    names = []
    for selection in selections:
        card = cards.get(selection.id)
        if card is None or card["version"] != selection.expected_version:
            raise OpenFailure("Invalid Skill selection")
        names.append(card["name"])
    return names


async def _session_attachments(state: FleetState, session_id: str, ids: list[str]) -> list[str]:
    """The turn's attachments as attachments of its session: an upload of no session (or another) is
    placed in this session's ``files/`` first."""
    placed = []
    for attachment_id in ids:
        try:
            row = await state.store.get_attachment(attachment_id) if ID_PATTERN.match(attachment_id) else None
        except NotFoundError:
            row = None
        if row is None:
            raise OpenFailure("Invalid request")
        if row.session_id != session_id:
            data = await state.store.get_blob(row.sha256)
            row = (await _sessions(state).attach(session_id, row.filename, data, row.mime)).attachment
        placed.append(row.attachment_id)
    return placed


async def _open(state: FleetState, session_id: str, body: TurnRequest, key: str) -> tuple[TurnRow, bool]:
    """Start the turn (or find the one of this key): ``(turn, replayed)``; ``OpenFailure`` when it cannot."""
    if not ID_PATTERN.match(session_id):
        raise OpenFailure("Session not found")
    try:
        await state.store.get_session(session_id)
        skills = await _skill_names(state, body.skill_selections)
        attachments = await _session_attachments(state, session_id, body.attachment_ids)
        handle = await state.runner.start(
            session_id, body.text, idempotency_key=key, skills=skills, attachment_ids=attachments
        )
    except NotFoundError:
        raise OpenFailure("Session not found") from None
    except ConflictError:
        raise OpenFailure("A Turn is already running") from None
    except ValidationError as exc:
        raise OpenFailure(
            "Idempotency key input mismatch" if "Idempotency-Key" in exc.message else "Invalid request"
        ) from None
    except FleetError:
        raise OpenFailure("Turn is unavailable") from None
    return handle.turn, not handle.created


@router.post(f"{API}/sessions/{{session_id}}/turns")
async def create_turn(
    session_id: str,
    body: TurnRequest,
    state: State,
    idempotency_key: Annotated[str, Header(alias="Idempotency-Key", min_length=1, max_length=128)],
) -> Response:
    """The turn as 0.7.11's chunk stream; every failure after the request is valid is inside the 200 stream."""
    turn: TurnRow | None = None
    failure = None
    replay = False
    try:
        turn, replay = await _open(state, session_id, body, idempotency_key)
    except OpenFailure as exc:
        failure = str(exc)
    translator = wire.ChunkTranslator(
        session_id, turn.run_id if turn else "", turn.turn_id if turn else "", replay=replay
    )
    frames = turn_frames(state, translator, turn, failure, encode=wire.chunk_frame, end=wire.DONE_FRAME)
    return event_stream(frames, heartbeat_s=state.heartbeat_s, headers=wire.STREAM_HEADERS)


@router.put(f"{API}/runs/{{run_id}}/cancellation")
async def request_cancellation(run_id: str, state: State) -> dict[str, Any]:
    if not ID_PATTERN.match(run_id):
        raise _not_found("run_not_found", "Run not found")
    try:
        row, outcome = await state.store.request_cancel(run_id, CANCEL_REASON)
    except NotFoundError:
        raise _not_found("run_not_found", "Run not found") from None
    if outcome == "requested":  # the store reaches the owner within a heartbeat; when it is us, act at once
        state.runner.cancel(row.turn_id, CANCEL_REASON)
    return {"run_id": run_id, "state": outcome}


# ---------------------------------------------------------------------- attachments, artifacts, volume


@router.post(f"{API}/attachments", status_code=201)
async def upload_attachment(attachment: Annotated[UploadFile, File()], state: State) -> dict[str, Any]:
    """Kept durably, of no session until a turn names it (then it is placed in that session's ``files/``)."""
    limit = _sessions(state).max_upload_bytes
    data = await attachment.read(limit + 1)
    if len(data) > limit:
        raise ReferenceError(400, "attachment_invalid", f"the attachment is larger than {limit} bytes")
    filename = (attachment.filename or "upload.bin")[:255]
    mime = attachment.content_type or "application/octet-stream"
    row = await state.store.add_attachment(session_id=None, filename=filename, path="", mime=mime, data=data)
    return wire.attachment_body(row)


@router.get(f"{API}/attachments/{{attachment_id}}")
async def get_attachment(attachment_id: str, state: State) -> dict[str, Any]:
    try:
        if not ID_PATTERN.match(attachment_id):
            raise NotFoundError(attachment_id)
        return wire.attachment_body(await state.store.get_attachment(attachment_id))
    except NotFoundError:
        raise _not_found("attachment_not_found", "Attachment not found") from None


async def _artifact(state: FleetState, artifact_id: str) -> Any:
    try:
        if not ID_PATTERN.match(artifact_id):
            raise NotFoundError(artifact_id)
        return await state.store.get_artifact(artifact_id)
    except NotFoundError:
        raise _not_found("artifact_not_found", "Artifact not found") from None


@router.get(f"{API}/artifacts/{{artifact_id}}")
async def get_artifact(artifact_id: str, state: State) -> dict[str, Any]:
    row = await _artifact(state, artifact_id)
    turn = await state.store.get_turn(row.turn_id)
    return wire.artifact_body(row, turn.run_id)


@router.get(f"{API}/artifacts/{{artifact_id}}/content")
async def download_artifact(artifact_id: str, state: State) -> Response:
    row = await _artifact(state, artifact_id)
    data = await state.store.get_blob(row.sha256)
    return content_response(data, mime=row.mime, filename=row.path.rsplit("/", 1)[-1], sha256=row.sha256)


def _volume_paths(state: FleetState, root: str, max_depth: int, max_files: int) -> dict[str, Any]:
    """Fleet's workspaces seen as the reference's volume: session ``<id>``'s workspace is ``sessions/<id>/``."""
    invalid = ReferenceError(400, "volume_tree_invalid", "Volume tree request is invalid")
    requested = PurePosixPath(root)
    if "\x00" in root or "\\" in root or ".." in requested.parts:
        raise invalid
    if requested.is_absolute():
        if not requested.is_relative_to(MOUNT):
            raise invalid
        requested = requested.relative_to(MOUNT)
    parts = [p for p in requested.parts if p != "."]
    if parts and parts[0] != "sessions":
        raise invalid  # Fleet's volume holds only session workspaces
    try:
        _listed, entries, truncated = list_tree(
            state.settings.workspaces_dir, "/".join(parts[1:]), max_depth=min(max_depth, MAX_DEPTH), limit=MAX_ENTRIES
        )
    except (NotFoundError, ValidationError):
        raise invalid from None
    files = sorted(f"sessions/{e['path']}" for e in entries if e["type"] == "file")
    return {
        "paths": files[:max_files],
        "directories": ["sessions"] if not parts else [],
        "truncated": truncated or len(files) > max_files,
    }


@router.get(f"{API}/volume/tree")
async def volume_tree(
    state: State,
    root: str = Query(".", min_length=1, max_length=256),
    max_depth: int = Query(8, ge=1, le=32),
    max_files: int = Query(2_000, ge=1, le=10_000),
) -> dict[str, Any]:
    return await asyncio.to_thread(_volume_paths, state, root, max_depth, max_files)


# ---------------------------------------------------------------------- what Fleet does not serve


@router.api_route(f"{API}/files", methods=METHODS, include_in_schema=False)
@router.api_route(f"{API}/files/{{rest:path}}", methods=METHODS, include_in_schema=False)
async def workspace_files(request: Request) -> Response:
    """0.7.11's workspace-wide ``files/`` namespace: Fleet's files belong to a session
    (Fleet's ``/api/sessions/{id}/workspace``), so there is none to serve."""
    raise ReferenceError(
        503,
        "workspace_files_unavailable",
        "Workspace files are not supported by this server: files belong to a session",
    )


@router.get(f"{API}/openapi.json", include_in_schema=False)
async def profile_schema() -> dict[str, Any]:
    """The 0.7.11 profile's own document, in the reference's paths (relative to the profile's prefix)."""
    document = get_openapi(
        title="Fleet: fleet-rlm 0.7.11 profile",
        version=__version__,
        description="fleet-rlm 0.7.11's HTTP + SSE contract over Fleet's engine and store (docs/api.md).",
        routes=router.routes,
        servers=[{"url": PREFIX}],
    )
    document["paths"] = {path.removeprefix(PREFIX): item for path, item in document["paths"].items()}
    return document


@router.api_route(f"{API}/{{rest:path}}", methods=METHODS, include_in_schema=False)
async def unknown_route(rest: str) -> Response:
    """Any other path under the profile's ``/api``: the reference's 404 envelope, not Fleet's."""
    raise ReferenceError(404, "not_found", "Resource not found")
