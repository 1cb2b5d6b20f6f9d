"""What prepares a turn before it runs: its task checked, its attachments found and placed in the
workspace, and the job the turn's thread runs (history planned, workspace manifest, host tools)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_kernel.engine import choices as turn_choices
from fleet_kernel.engine import compaction
from fleet_kernel.engine.host_tools import HostTools
from fleet_kernel.engine.memory import Memories
from fleet_kernel.engine.running import RunningTurn
from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.lazy import import_module
from fleet_kernel.store import AttachmentRow, Store, TurnRow
from fleet_kernel.workspace import Workspace

if TYPE_CHECKING:
    from fleet_kernel.engine.turn import LMFactory, TurnJob

MAX_TASK_CHARS = 100_000
MAX_CELL_ID_CHARS = 200


def check_task(task: str, cell_id: str | None) -> None:
    """Raises ``ValidationError`` for an empty or oversized task, or a cell id of the wrong length."""
    if not task or not task.strip():
        raise ValidationError("the task is empty: write what the model should do")
    if len(task) > MAX_TASK_CHARS:
        raise ValidationError(
            f"the task is {len(task)} characters; the limit is {MAX_TASK_CHARS}. Attach long text as a file"
        )
    if cell_id is not None and not 0 < len(cell_id) <= MAX_CELL_ID_CHARS:
        raise ValidationError(f"a cell id has 1 to {MAX_CELL_ID_CHARS} characters; this one has {len(cell_id)}")


async def turn_attachments(
    store: Store, session_id: str, attachment_ids: list[str] | tuple[str, ...]
) -> list[AttachmentRow]:
    """The session's attachments named by a turn, in order. Raises ``ValidationError`` for any other id."""
    ids = list(dict.fromkeys(attachment_ids))
    if ids:
        await store.get_session(session_id)  # an unknown session is a 404, as without attachments
    if len(ids) > turn_choices.MAX_ATTACHMENTS:
        raise ValidationError(f"a turn takes at most {turn_choices.MAX_ATTACHMENTS} attachments; got {len(ids)}")
    rows = []
    for attachment_id in ids:
        try:
            row = await store.get_attachment(str(attachment_id))
        except NotFoundError:
            row = None
        if row is None or row.session_id != session_id:
            raise ValidationError(
                f"{str(attachment_id)[:80]!r} is not an attachment of session {session_id}: "
                "upload it with POST /api/attachments (session_id of this session) first"
            )
        rows.append(row)
    return rows


async def place_files(
    store: Store, workspaces_dir: Path, turn: TurnRow, rows: list[AttachmentRow]
) -> list[turn_choices.TurnFile]:
    """Each attachment of the turn in ``files/``, restored from the store when it is gone or changed."""
    if not rows:
        return []
    workspace = await asyncio.to_thread(Workspace.for_session, workspaces_dir, turn.session_id)
    files = []
    for row in rows:
        found = await asyncio.to_thread(turn_choices.file_in_place, workspace, row)
        if found is None:
            data = await store.get_blob(row.sha256)
            found = await asyncio.to_thread(turn_choices.place_file, workspace, row, data)
        files.append(found)
    return files


async def prepare_job(
    store: Store,
    workspaces_dir: Path,
    configured_tools: HostTools,
    lm_factory: LMFactory | None,
    running: RunningTurn,
) -> TurnJob:
    """The job the turn's thread runs: its history planned (``compaction``), the workspace and its manifest,
    and its tools (memories, the host tools it named or all ``configured_tools``, the notebook's)."""
    turn = running.turn
    window_turns = running.settings.policy.history.window_turns

    def load() -> tuple[Workspace, str, compaction.Window]:
        # dspy loads (or finishes loading) here, off the loop: it keeps delivering the turn's first events
        import_module("fleet_kernel.engine.turn")
        workspace = Workspace.for_session(workspaces_dir, turn.session_id)
        return workspace, workspace.manifest(), compaction.window_for(running.settings)

    history = store.history_read(turn.session_id, window=window_turns, before_position=turn.position)
    (workspace, manifest, window), past = await asyncio.gather(asyncio.to_thread(load), history)
    plan = await compaction.plan(store, past, window)
    from fleet_kernel.engine.turn import TurnJob  # noqa: PLC0415 - engine.turn imports dspy (~1.5 s), loaded off the event loop

    running.memories = Memories(store, running.settings, turn.session_id)
    host_tools = running.host_tools
    if host_tools is None and configured_tools.configured:  # all of them: the MCP servers start now
        host_tools = await asyncio.to_thread(configured_tools.select, None)
    return TurnJob(
        settings=running.settings,
        emitter=running.emitter,
        task=turn.task,
        history=plan.text(),
        history_plan=plan,
        workspace=workspace.root,
        workspace_manifest=manifest,
        cancel=running.cancel,
        lm_factory=lm_factory,
        inputs=running.inputs,
        catalogue=running.catalogue,
        choices=running.choices,
        tools=[
            *running.memories.tools(asyncio.get_running_loop()),
            *(t.as_dspy() for t in host_tools or ()),
            *(running.notebook.host_tools() if running.notebook else ()),
        ],
        notebook_prompt=running.notebook.prompt if running.notebook else "",
        unlisted_tools=await running.memories.unlisted(),
    )
