"""A session's memories over HTTP: the same ones the model keeps with ``remember`` in its turns."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import MEMORY_PUT_EXAMPLES, Memory, MemoryList, MemoryPut
from fleet_kernel.engine.memory import Memories

router = APIRouter(tags=["memory"])


async def _memories(state: State, session_id: str) -> Memories:
    await state.store.get_session(check_id(session_id, "session"))
    return Memories(state.store, state.settings, session_id)


@router.get("/sessions/{session_id}/memory", response_model=MemoryList, responses=errors(404))
async def list_memories(session_id: str, state: State, q: str | None = None) -> MemoryList:
    """Every memory of the session, oldest first; with ``q``, those matching its words, best first."""
    memories = await _memories(state, session_id)
    return MemoryList(memories=[Memory.model_validate(r.to_dict()) for r in await memories.listing(q)])


@router.put("/sessions/{session_id}/memory/{memory_id}", response_model=Memory, responses=errors(404))
async def put_memory(
    session_id: str,
    memory_id: str,
    body: Annotated[MemoryPut, Body(openapi_examples=MEMORY_PUT_EXAMPLES)],
    state: State,
) -> Memory:
    """Create the memory with this id, or replace it."""
    memories = await _memories(state, session_id)
    row = await memories.put(body.content, body.kind, memory_id=memory_id)
    await memories.mirror()
    return Memory.model_validate(row.to_dict())


@router.delete(
    "/sessions/{session_id}/memory/{memory_id}", status_code=204, response_class=Response, responses=errors(404)
)
async def delete_memory(session_id: str, memory_id: str, state: State) -> Response:
    memories = await _memories(state, session_id)
    if not await memories.forget(memory_id):
        await state.store.get_memory(session_id, memory_id)  # raises the 404
    await memories.mirror()
    return Response(status_code=204)
