"""fleet-rlm 0.8.1's HTTP + SSE contract over Fleet's engine and store (the "fleet-rlm profile"); its
0.7.11 contract (paths under ``/api``) is ``fleet_api.compat.v0711``, built on the helpers here.

Each route does what the reference's route of that path does, through Fleet's own services; the
bodies and stream envelopes come from ``fleet_api.compat.wire``. Errors are the reference's
``{"detail": ...}`` with its status codes (``ReferenceRoute``), not Fleet's envelope.

Where Fleet chose differently the profile does what the reference's clients expect: a session id is
the client's and is created on first use; a dropped stream cancels the turn; a failure after the
stream opened is an ``error`` event inside the 200 stream. Reference features Fleet lacks
(execution modes other than rlm, a bound context file, replay capture, moving skills between a
volume and local storage) answer 422 saying so.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing, nullcontext
from typing import Annotated, Any, Protocol, cast

from fastapi import APIRouter, File, Query, Request, Response, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException

from fleet_api.compat import wire
from fleet_api.deps import FleetState, State, check_id
from fleet_api.routes._content import FileStream
from fleet_api.sse import event_stream
from fleet_kernel import __version__
from fleet_kernel.engine.memory import Memories
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.engine.workspace_files import WorkspaceFiles
from fleet_kernel.errors import ConflictError, FleetError, NotFoundError, ValidationError
from fleet_kernel.events import Event
from fleet_kernel.skills import catalogue_for
from fleet_kernel.store import TurnRow
from fleet_kernel.workspace import Workspace, guess_mime

log = logging.getLogger("fleet_api")

PREFIX = "/compat/fleet-rlm"
ATTACH_PATH = rf"^{PREFIX}/sessions/[^/]+/attach$"
BUSY = "A Turn is running on this Session; retry when it completes"
LOCK_WAIT_S = 2.0  # the reference's LOCKED routes wait this long for the session's turn lock
CANCEL_REASON = "the client closed the turn's stream (fleet-rlm profile)"
WORKSPACE_ROOTS = ("files", "artifacts", "memory")
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MEMORY_KINDS = "^(observation|preference|hypothesis|procedure)$"
_background: set[asyncio.Task[Any]] = set()  # durable cancellations still being written


def _reference_error(exc: FleetError | RequestValidationError, request: Request | None = None) -> JSONResponse:
    """A Fleet failure as the reference reports it: 404, 409, 413 and 422 keep their meaning, the rest is 503."""
    if isinstance(exc, RequestValidationError):
        return JSONResponse({"detail": _plain(exc.errors())}, status_code=422)
    status = exc.status if exc.status in (400, 404, 409, 413, 422) else 503
    if isinstance(exc, ValidationError):
        status = 422
    return JSONResponse(wire.error_body(exc.message), status_code=status)


def _plain(errors: Any) -> list[dict[str, Any]]:
    return [{"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors]


def reference_route(render: Callable[[FleetError | RequestValidationError, Request], Response]) -> type[APIRoute]:
    """A route class that answers its errors with ``render`` (each profile's envelope, given the request),
    leaving Fleet's handlers for Fleet's routes. Both profiles' routers are built from it."""

    class ReferenceRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                try:
                    return await handler(request)
                except (FleetError, RequestValidationError) as exc:
                    return render(exc, request)
                except HTTPException as exc:  # a body cut off at the size limit (413), or unparsable (400)
                    return render(FleetError(str(exc.detail), status=exc.status_code), request)

            return handle

    return ReferenceRoute


router = APIRouter(prefix=PREFIX, route_class=reference_route(_reference_error))
"""Mounted with ``include_in_schema=False``: Fleet's document leaves the profile out, and the profile serves
its own at ``{PREFIX}/openapi.json`` (built from these routes)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as the reference: an unknown field is a 422


class TurnRequest(_Request):
    task: str = Field(min_length=1, max_length=100_000)
    idempotency_key: str | None = Field(default=None, max_length=128)
    record_replay: bool = False
    timeout_seconds: int | None = Field(default=None, strict=True)

    @field_validator("timeout_seconds")
    @classmethod
    def _bounded(cls, value: int | None) -> int | None:
        if value is not None and value != 0 and not 10 <= value <= 3600:
            raise ValueError("timeout_seconds must be 0 or between 10 and 3600")
        return value


class ModeRequest(_Request):
    mode: str = Field(pattern="^(rlm|flex|hybrid)$")


class ModelRequest(_Request):
    role: str = Field(default="root", pattern="^(root|sub)$")
    model: str = Field(min_length=1, max_length=300)


class ContextRequest(_Request):
    path: str = Field(min_length=1, max_length=1024)
    description: str = Field(default="", max_length=2000)


def _sessions(state: FleetState) -> Sessions:
    return Sessions(state.store, state.settings)


def _session_id(value: str) -> str:
    """The reference refuses an id that cannot name a volume folder with 422, before anything else."""
    if not SESSION_ID.fullmatch(value) or ".." in value:
        raise ValidationError("session_id must be 1-64 letters, digits, dots, underscores, or hyphens")
    return value


async def _ensure_session(state: FleetState, session_id: str) -> None:
    """The reference creates a session on the first call that needs it, under the client's id."""
    _session_id(session_id)
    try:
        await state.store.get_session(session_id)
    except NotFoundError:
        try:
            await _sessions(state).create("", session_id)
        except ConflictError:  # created by a concurrent first call
            pass


async def _idle_session(state: FleetState, session_id: str) -> None:
    """The reference's LOCKED routes: an existing session with no running turn, else 409 once the turn
    has held it for ``LOCK_WAIT_S`` (as the reference tries its lock), so a turn that is ending (a
    cancelled stream's) does not refuse the next command."""
    await _ensure_session(state, session_id)
    await _wait_idle(state, session_id)


async def _wait_idle(state: FleetState, session_id: str) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while await state.store.running_turn_id(session_id) is not None:
        if time.monotonic() >= deadline:
            raise ConflictError(BUSY)
        await asyncio.sleep(0.1)


def _not_supported(what: str) -> ValidationError:
    return ValidationError(f"{what} is not supported by this server (Fleet runs every turn as dspy.RLM)")


# ---------------------------------------------------------------------- service and sessions


@router.get("/health")
async def health(state: State) -> dict[str, Any]:
    problem = await state.store_problem()
    mlflow = {
        "mode": "local",
        "tracking_uri": "",
        "experiment_name": "",
        "eval_experiment_name": "",
        "optimization_experiment_name": "",
        "ready": False,
    }
    status = "ok" if problem is None else "degraded"
    # ``app`` is 0.7.11's field of the same route: one body serves both versions' clients
    return {"status": status, "app": "fleet", "version": __version__, "mlflow": mlflow}


@router.get("/sessions")
async def list_sessions(state: State) -> dict[str, Any]:
    rows = await state.store.list_sessions(100)
    return {"sessions": [wire.session_summary(r.session_id, r.updated_at, r.turn_count) for r in rows]}


@router.delete("/sessions/{session_id}")
async def evict_session(session_id: str, state: State) -> dict[str, Any]:
    """The reference drops the session's runtime and keeps its history; Fleet holds no runtime between
    turns, so this only refuses an unknown (404) or busy (409) session, as the reference does."""
    await state.store.get_session(_session_id(session_id))
    await _wait_idle(state, session_id)
    return {"deleted": session_id}


@router.get("/models")
async def list_models(state: State, scope: str = "system.ai") -> dict[str, Any]:
    models = [m for m in (state.settings.lm_model, state.settings.sub_lm_model) if m]
    return {"scope": scope, "models": list(dict.fromkeys(models))}


@router.get("/sessions/{session_id}/config")
async def session_config(session_id: str, state: State) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    config = await _sessions(state).config(session_id, await state.runner.sandbox_name())
    limits = state.settings.policy.limits
    values = {"lm_model": config.get("model"), "sub_lm_model": config.get("sub_model")}
    digest = hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()
    return {
        "mode": "rlm",
        "models": {"root": config.get("model") or "", "sub": config.get("sub_model") or ""},
        "context": None,
        "configuration": {"schema_version": 4, "digest": digest, "values": values, "sources": {}},
        "limits": {
            "lm_calls": limits.max_llm_calls,
            "depth": limits.max_depth,
            "children": limits.max_children,
            "active_children": limits.max_children,
            "timeout_seconds": int(limits.turn_timeout_s),
        },
    }


@router.put("/sessions/{session_id}/model")
async def select_model(session_id: str, body: ModelRequest, state: State) -> dict[str, Any]:
    await _idle_session(state, session_id)
    await _sessions(state).update(session_id, {"model" if body.role == "root" else "sub_model": body.model})
    return {"role": body.role, "model": body.model}


@router.get("/sessions/{session_id}/mode")
async def get_mode(session_id: str, state: State) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    return {"mode": "rlm"}


@router.put("/sessions/{session_id}/mode")
async def set_mode(session_id: str, body: ModeRequest, state: State) -> dict[str, Any]:
    await _idle_session(state, session_id)
    if body.mode != "rlm":
        raise _not_supported(f"mode {body.mode!r}")
    return {"mode": "rlm"}


@router.put("/sessions/{session_id}/context")
async def select_context(session_id: str, body: ContextRequest, state: State) -> dict[str, Any]:
    await _idle_session(state, session_id)
    raise _not_supported("binding a workspace file as the context")


@router.delete("/sessions/{session_id}/context")
async def clear_context(session_id: str, state: State) -> dict[str, Any]:
    await _idle_session(state, session_id)
    return {"status": "cleared"}  # nothing is ever bound


@router.get("/sessions/{session_id}/history")
async def history(session_id: str, state: State) -> dict[str, Any]:
    try:
        rows = await state.store.list_turns(_session_id(session_id))
    except NotFoundError:
        rows = []  # the reference reads its table directly: no session, no turns
    return {"session_id": session_id, "turns": [wire.history_record(r) for r in rows if r.status == "completed"]}


@router.get("/sessions/{session_id}/turns/{turn_id}")
async def turn_status(session_id: str, turn_id: str, state: State) -> dict[str, Any]:
    row = await state.store.get_turn(check_id(turn_id, "turn"), _session_id(session_id))
    return wire.turn_status(row)


# ---------------------------------------------------------------------- workspace, memory, skills


def _listing(state: FleetState, session_id: str) -> dict[str, Any]:
    workspace = Workspace.for_session(state.settings.workspaces_dir, session_id)
    files = sorted(path for root in WORKSPACE_ROOTS for path, _stat in workspace.files(root))
    return {"session_id": session_id, "files": files, "artifacts": [p for p in files if p.startswith("artifacts/")]}


@router.get("/sessions/{session_id}/files")
@router.get("/sessions/{session_id}/workspace/tree")
async def workspace_files(session_id: str, state: State) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    return await asyncio.to_thread(_listing, state, session_id)


@router.post("/sessions/{session_id}/attach")
async def attach(session_id: str, file: Annotated[UploadFile, File()], state: State) -> dict[str, Any]:
    """Into ``files/``; unlike the reference, a different file of the same name is kept (the new one is renamed)."""
    if not file.filename:  # what a browser sends for a file input with nothing chosen
        raise ValidationError("choose a file to attach")
    await _ensure_session(state, session_id)
    sessions = _sessions(state)
    data = await file.read(sessions.max_upload_bytes + 1)
    attached = await sessions.attach(session_id, file.filename or "attachment", data, file.content_type)
    rel = attached.attachment.path
    return {"mounted_path": f"/workspace/{rel}", "rel_path": rel}


@router.get("/sessions/{session_id}/memory")
async def list_memory(session_id: str, state: State, q: str = Query("", max_length=200)) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    rows = await Memories(state.store, state.settings, session_id).listing(q or None)
    memories = [
        {"memory_id": r.memory_id, "content": r.content, "kind": r.kind, "sources": {}, "reviewed": True} for r in rows
    ]
    return {"memories": memories[:20]}


class MemoryRequest(_Request):
    content: str = Field(min_length=1, max_length=10_000)
    kind: str = Field(default="observation", pattern=MEMORY_KINDS)
    sources: dict[str, str] = Field(default_factory=dict, max_length=100)
    reviewed: bool = False


@router.put("/sessions/{session_id}/memory/{memory_id}")
async def put_memory(session_id: str, memory_id: str, body: MemoryRequest, state: State) -> dict[str, Any]:
    """Saved in Fleet's memory store (``sources`` and ``reviewed`` are not kept: every memory is in the prompt)."""
    await _ensure_session(state, session_id)
    memories = Memories(state.store, state.settings, session_id)
    row = await memories.put(body.content, body.kind, memory_id=check_id(memory_id, "memory"))
    await memories.mirror()
    return {"memory_id": row.memory_id}


@router.delete("/sessions/{session_id}/memory/{memory_id}")
async def delete_memory(session_id: str, memory_id: str, state: State) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    memories = Memories(state.store, state.settings, session_id)
    if not await memories.forget(check_id(memory_id, "memory")):
        raise NotFoundError("Memory not found")
    await memories.mirror()
    return {"deleted": memory_id}


@router.get("/skills")
async def skills_catalog(state: State) -> dict[str, Any]:
    catalogue = await asyncio.to_thread(catalogue_for, state.settings)
    return {"catalog_xml": wire.skills_xml([(s.name, s.description) for s in catalogue])}


@router.post("/skills/pull")
@router.post("/skills/push")
async def move_skills(state: State, session_id: str = "default") -> dict[str, Any]:
    """The reference copies skills between a session's sandbox volume and local storage; Fleet's skills
    are read where they are (bundled, ``~/.fleet/skills``, the project), so there is nothing to move."""
    _session_id(session_id)
    raise _not_supported("moving skills between a session volume and local storage (Fleet reads them in place)")


class WriteRequest(_Request):
    content: str | None = Field(default=None, max_length=25_000_000)
    content_base64: str | None = Field(default=None, max_length=34_000_000)


def _files(state: FleetState, session_id: str) -> WorkspaceFiles:
    return WorkspaceFiles(state.store, state.settings, session_id)


async def _existing_file(call: Coroutine[Any, Any, Any]) -> Any:
    """The reference answers 404 for a missing file and for a path it refuses alike."""
    try:
        return await call
    except ValidationError as exc:
        raise NotFoundError(exc.message) from None


@router.get("/sessions/{session_id}/workspace/stat/{rel_path:path}")
async def workspace_stat(session_id: str, rel_path: str, state: State) -> dict[str, Any]:
    await _ensure_session(state, session_id)
    found = await _existing_file(_files(state, session_id).stat(rel_path))
    return wire.workspace_stat(found.path, found.size, found.sha256)


@router.get("/sessions/{session_id}/workspace/files/{rel_path:path}")
async def read_workspace_file(session_id: str, rel_path: str, state: State) -> Response:
    """The file's bytes (an artifact's download too), streamed; Fleet's inert headers are kept."""
    await _ensure_session(state, session_id)
    rel, opened = await _existing_file(_files(state, session_id).open(rel_path))
    return FileStream(opened, mime=guess_mime(rel), filename=rel.rsplit("/", 1)[-1])


@router.put("/sessions/{session_id}/workspace/files/{rel_path:path}")
async def write_workspace_file(session_id: str, rel_path: str, body: WriteRequest, state: State) -> dict[str, Any]:
    if (body.content is None) == (body.content_base64 is None):
        raise ValidationError("Supply exactly one of content or content_base64")
    try:
        data = (
            body.content.encode()
            if body.content is not None
            else base64.b64decode(body.content_base64 or "", validate=True)
        )
    except binascii.Error:
        raise ValidationError("content_base64 is not valid base64") from None
    await _idle_session(state, session_id)
    found = await _files(state, session_id).write(rel_path, data)
    return wire.workspace_stat(found.path, found.size, found.sha256) | {"mounted_path": f"/workspace/{found.path}"}


@router.delete("/sessions/{session_id}/workspace/files/{rel_path:path}")
async def delete_workspace_file(session_id: str, rel_path: str, state: State) -> dict[str, Any]:
    await _idle_session(state, session_id)
    await _existing_file(_files(state, session_id).delete(rel_path))
    return {"deleted": rel_path}


# ---------------------------------------------------------------------- the turn stream


def _cancel(state: FleetState, turn: TurnRow) -> None:
    """A dropped stream cancels its turn, here at once and durably for a runner elsewhere."""
    state.runner.cancel(turn.turn_id, CANCEL_REASON)
    task = asyncio.get_running_loop().create_task(state.store.request_cancel(turn.run_id, CANCEL_REASON))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _fleet_events(state: FleetState, turn: TurnRow) -> AsyncGenerator[Event, None]:
    """The turn's events from seq 1, followed live (through the store tail when it runs elsewhere)."""
    elsewhere = not state.runner.is_running_here(turn.turn_id)
    tailing = state.tail.tailing(turn.turn_id, turn.last_seq) if elsewhere else nullcontext()
    async with tailing, aclosing(cast(AsyncGenerator[Event, None], state.runner.follow(turn.turn_id, 0))) as events:
        async for event in events:
            yield event
            if event.terminal:
                return


class Translator(Protocol):
    """What the stream core needs of a profile's translator (``wire.StreamTranslator``, ``wire.ChunkTranslator``)."""

    outcome_sent: bool

    def prelude(self, ts: float) -> dict[str, Any]: ...
    def error(self, message: str, ts: float) -> list[dict[str, Any]]: ...
    def translate(self, event: Event) -> list[dict[str, Any]]: ...


async def turn_frames(
    state: FleetState,
    translator: Translator,
    turn: TurnRow | None,
    failure: str | None,
    *,
    encode: Callable[[dict[str, Any]], bytes],
    end: bytes = b"",
) -> AsyncIterator[bytes]:
    """A turn's stream in a profile's framing (``encode``): the prelude, then the turn's events from seq
    1 translated (or ``failure`` as an in-stream error), then ``end`` once an outcome was sent. Closing
    the stream before the outcome cancels the turn, as the reference does."""
    yield encode(translator.prelude(time.time()))
    if turn is None:
        for envelope in translator.error(failure or "The Turn failed.", time.time()):
            yield encode(envelope)
        if end:
            yield end
        return
    try:
        async with aclosing(_fleet_events(state, turn)) as events:
            async for event in events:
                for envelope in translator.translate(event):
                    yield encode(envelope)
    finally:
        if not translator.outcome_sent:
            _cancel(state, turn)
    if translator.outcome_sent and end:
        yield end


@router.post("/sessions/{session_id}/turn")
async def stream_turn(session_id: str, body: TurnRequest, state: State) -> Response:
    if body.record_replay:
        raise _not_supported("record_replay")
    await _ensure_session(state, session_id)
    limits = {"turn_timeout_s": float(body.timeout_seconds)} if body.timeout_seconds else None
    if body.timeout_seconds == 0:
        raise _not_supported("timeout_seconds 0 (no deadline)")
    turn: TurnRow | None = None
    failure = None
    try:
        handle = await state.runner.start(session_id, body.task, idempotency_key=body.idempotency_key, limits=limits)
        turn = handle.turn
    except ConflictError:
        raise ConflictError(BUSY) from None
    except ValidationError as exc:  # the reference reports these inside the stream
        failure = exc.message
    translator = wire.StreamTranslator(session_id, turn.turn_id if turn is not None else "")
    frames = turn_frames(state, translator, turn, failure, encode=wire.sse_frame)
    return event_stream(frames, heartbeat_s=state.heartbeat_s)


@router.get("/openapi.json", include_in_schema=False)
async def profile_schema() -> dict[str, Any]:
    """The profile's own document, in the reference's paths (relative to this prefix)."""
    document = get_openapi(
        title="Fleet: fleet-rlm 0.8.1 profile",
        version=__version__,
        description="fleet-rlm 0.8.1's HTTP + SSE contract over Fleet's engine and store (docs/api.md).",
        routes=router.routes,
        servers=[{"url": PREFIX}],
    )
    document["paths"] = {path.removeprefix(PREFIX): item for path, item in document["paths"].items()}
    return document
