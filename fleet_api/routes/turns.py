"""Start a turn, read it, and stream its events (replay from the store, then the live tail).

Errors a client can act on (unknown session, busy session, bad key) are answered before the stream
opens; after that the turn runs on its own, and dropping the stream never cancels it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, nullcontext
from typing import Annotated, cast

from fastapi import APIRouter, Body, Header, Query, Response
from fastapi.responses import JSONResponse

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import TURN_CREATE_EXAMPLES, TURN_UPDATE_EXAMPLES, Turn, TurnAccepted, TurnCreate, TurnUpdate
from fleet_api.sse import SSE_RESPONSE_DOC, event_stream, parse_last_event_id
from fleet_api.views import turn_view
from fleet_kernel.errors import ValidationError
from fleet_kernel.events import Event
from fleet_kernel.store import TurnRow

router = APIRouter(tags=["turns"])

# The hub carries every event of a followed turn; the store is reread only after this long without one.
QUIET_S = 1.0

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x20-\x7e]+$",
        description="repeat it to get the same turn (its stored events, or the live tail) instead of a new run",
    ),
]
Prefer = Annotated[
    str | None, Header(alias="Prefer", description="`respond-async`: answer 202 at once; the turn runs detached")
]
LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", description="resume after this seq (no gap, no duplicate)")
]
After = Query(None, ge=0, description="resume after this seq; Last-Event-ID wins when both are given")


def _resume_from(last_event_id: str | None, after: int | None) -> int:
    try:
        seq = parse_last_event_id(last_event_id)
    except ValueError:
        raise ValidationError(
            "Last-Event-ID must be the seq (a non-negative integer) of the last event received"
        ) from None
    return seq if seq is not None else (after or 0)


async def _frames(state: State, turn: TurnRow, after: int) -> AsyncIterator[bytes]:
    """The turn's frames after seq ``after``, ending with its terminal event (nothing if the client has it).

    A finished turn is read once per process and then replayed from memory in one write. A running
    one is followed: the hub carries every event (from the event writer when the turn runs here, from
    the store tail when it runs in another process), so ``follow`` rereads the store only after a gap
    or a long quiet spell.
    """
    frames = state.frames.finished(turn.turn_id)
    if frames is None and turn.status != "running":
        frames = state.frames.keep_finished(await state.sessions.events(turn.turn_id))
    if frames is not None:
        if after < len(frames):
            yield b"".join(frames[after:])
        return
    elsewhere = not state.runner.is_running_here(turn.turn_id)
    tailing = state.tail.tailing(turn.turn_id, turn.last_seq) if elsewhere else nullcontext()
    follow = cast(AsyncGenerator[list[Event], None], state.runner.follow_batches(turn.turn_id, after, quiet_s=QUIET_S))
    async with tailing, aclosing(follow) as batches:
        async for batch in batches:  # one write per committed batch
            yield b"".join(state.frames.encode(event) for event in batch)


def _wants_async(prefer: str | None) -> bool:
    return prefer is not None and any(p.strip().lower() == "respond-async" for p in prefer.replace(";", ",").split(","))


@router.post(
    "/sessions/{session_id}/turns",
    summary="Start a turn and stream its events (or 202 with Prefer: respond-async)",
    response_class=Response,
    responses={
        200: SSE_RESPONSE_DOC,
        202: {"model": TurnAccepted, "description": "accepted; the turn runs detached (Prefer: respond-async)"},
        **errors(404, 409),
    },
)
async def start_turn(
    session_id: str,
    body: Annotated[TurnCreate, Body(openapi_examples=TURN_CREATE_EXAMPLES)],
    state: State,
    idempotency_key: IdempotencyKey = None,
    prefer: Prefer = None,
    last_event_id: LastEventId = None,
) -> Response:
    check_id(session_id, "session")
    after = _resume_from(last_event_id, None)
    handle = await state.runner.start(
        session_id,
        body.task,
        idempotency_key=idempotency_key,
        limits=body.limits.policy_names() if body.limits is not None else None,
        skills=body.skills,
        attachment_ids=body.attachment_ids,
        output_schema=body.output_schema,
        supersedes_turn_id=body.supersedes_turn_id,
        tools=body.tools,
    )
    turn = handle.turn
    headers = {
        "Location": f"/api/sessions/{session_id}/turns/{turn.turn_id}",
        "Fleet-Turn-Id": turn.turn_id,
        "Fleet-Run-Id": turn.run_id,
    }
    if _wants_async(prefer):
        accepted = TurnAccepted(
            turn_id=turn.turn_id,
            run_id=turn.run_id,
            session_id=session_id,
            status=turn.status,
            created=handle.created,
        )
        return JSONResponse(
            accepted.model_dump(), status_code=202, headers={**headers, "Preference-Applied": "respond-async"}
        )
    return event_stream(_frames(state, turn, after), heartbeat_s=state.heartbeat_s, headers=headers)


@router.get("/sessions/{session_id}/turns/{turn_id}", response_model=Turn, responses=errors(404))
async def get_turn(session_id: str, turn_id: str, state: State) -> Turn:
    row = await state.sessions.turn(check_id(session_id, "session"), check_id(turn_id, "turn"))
    return turn_view(row, await state.sessions.lineage(session_id))


@router.patch(
    "/sessions/{session_id}/turns/{turn_id}",
    response_model=Turn,
    summary="Take a turn out of the history later turns see, or put it back",
    responses=errors(404, 409),
)
async def update_turn(
    session_id: str,
    turn_id: str,
    body: Annotated[TurnUpdate, Body(openapi_examples=TURN_UPDATE_EXAMPLES)],
    state: State,
) -> Turn:
    sessions = state.sessions
    row = await sessions.keep_in_history(check_id(session_id, "session"), check_id(turn_id, "turn"), body.in_history)
    return turn_view(row, await sessions.lineage(session_id))


@router.get(
    "/sessions/{session_id}/turns/{turn_id}/events",
    summary="Replay a turn's events and tail it live until its terminal event",
    response_class=Response,
    responses={200: SSE_RESPONSE_DOC, **errors(404)},
)
async def turn_events(
    session_id: str,
    turn_id: str,
    state: State,
    last_event_id: LastEventId = None,
    after: int | None = After,
) -> Response:
    row = await state.sessions.turn(check_id(session_id, "session"), check_id(turn_id, "turn"))
    seq = _resume_from(last_event_id, after)
    headers = {"Fleet-Turn-Id": row.turn_id, "Fleet-Run-Id": row.run_id}
    return event_stream(_frames(state, row, seq), heartbeat_s=state.heartbeat_s, headers=headers)
