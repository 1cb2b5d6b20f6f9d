"""A session's memories over HTTP: the same ones the model keeps with ``remember`` in its turns."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import MEMORY_PUT_EXAMPLES, Memory, MemoryList, MemoryPut

router = APIRouter(tags=["memory"])


@router.get("/sessions/{session_id}/memory", response_model=MemoryList, responses=errors(404))
async def list_memories(session_id: str, state: State, q: str | None = None) -> MemoryList:
    """Every memory of the session, oldest first; with ``q``, those matching its words, best first."""
    memories = await state.sessions.memories(check_id(session_id, "session"))
    return MemoryList(memories=[Memory.model_validate(r.to_dict()) for r in await memories.listing(q)])


@router.put("/sessions/{session_id}/memory/{memory_id}", response_model=Memory, responses=errors(404))
async def put_memory(
    session_id: str,
    memory_id: str,
    body: Annotated[MemoryPut, Body(openapi_examples=MEMORY_PUT_EXAMPLES)],
    state: State,
) -> Memory:
    """Create the memory with this id, or replace it."""
    row = await state.sessions.remember(check_id(session_id, "session"), body.content, body.kind, memory_id=memory_id)
    return Memory.model_validate(row.to_dict())


@router.delete(
    "/sessions/{session_id}/memory/{memory_id}", status_code=204, response_class=Response, responses=errors(404)
)
async def delete_memory(session_id: str, memory_id: str, state: State) -> Response:
    sessions = state.sessions
    if not await sessions.forget_memory(check_id(session_id, "session"), memory_id):
        await sessions.memory(session_id, memory_id)  # raises the 404
    return Response(status_code=204)
