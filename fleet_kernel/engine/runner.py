"""``TurnRunner``: start, watch, cancel and finish turns; the one engine both front doors call.

A turn is claimed in the store (idempotency key, one running turn per session), announced with
``turn.started`` at once, then run by ``engine.turn.run_turn`` on its own thread while this side
waits for the outcome, a cancellation (in-process, or durable from the store) or the deadline.
This module imports no dspy, so a kernel can start before dspy is loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fleet_kernel import safe_files
from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import Settings
from fleet_kernel.engine import choices as turn_choices
from fleet_kernel.engine import compaction
from fleet_kernel.engine.budget import BudgetExceeded
from fleet_kernel.engine.choices import TurnChoices
from fleet_kernel.engine.host_tools import HostTool, HostTools
from fleet_kernel.engine.memory import Memories
from fleet_kernel.engine.outcome import Outcome, stopped
from fleet_kernel.engine.session_config import session_settings
from fleet_kernel.engine.sink import POLL_INTERVAL_S, EventHub, EventWriter, TurnEmitter, follow, follow_batches
from fleet_kernel.errors import NotFoundError, TurnDeadlineExceeded, ValidationError
from fleet_kernel.events import (
    Artifact,
    Event,
    EventData,
    TurnCancelledData,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
    lm_not_sent,
)
from fleet_kernel.lazy import import_module
from fleet_kernel.sandbox import contract as sandbox_contract
from fleet_kernel.skills import Catalogue, catalogue_for
from fleet_kernel.store import AttachmentRow, EndedTurn, Store, TurnEnding, TurnRow, describe_write_error, is_disk_full
from fleet_kernel.telemetry import Telemetry
from fleet_kernel.workspace import Workspace, guess_mime

if TYPE_CHECKING:
    from fleet_kernel.engine.turn import LMFactory, TurnJob

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
CANCEL_GRACE_S = 1.0
EXTRACT_GRACE_S = 30.0  # past the deadline, how long a turn may still take to extract its answer from its steps
ANNOUNCE_WAIT_S = 0.25
MAX_TASK_CHARS = 100_000
MAX_CELL_ID_CHARS = 200


@dataclass
class _Running:
    turn: TurnRow
    emitter: TurnEmitter
    settings: Settings
    catalogue: Catalogue
    choices: TurnChoices
    cancel: CancelToken = field(default_factory=CancelToken)  # the turn's one cancel token, handed down to it
    task: asyncio.Task[None] | None = None
    memories: Memories | None = None  # the session's memories, as the turn's host tools change them
    started: float = field(default_factory=time.monotonic)  # the deadline counts from here
    inputs: list[Any] = field(default_factory=list)  # engine.inputs.NotebookValue: the turn's input variables
    notebook: Any = None  # kernel.notebook_bridge.NotebookBridge: a %%fleet turn's notebook (prompt, tools)
    setup_error: dict[str, str] | None = None  # the turn could not be set up (its files); it fails
    admission: sandbox_contract.Admission | None = None  # what the sandbox backend set aside for the turn
    collecting: bool = False  # the turn's own work is over: its artifacts are collected
    late: str | None = None  # why it was cancelled while collecting (the token is spent by then)
    host_tools: list[HostTool] | None = None  # the [[tools]] and MCP tools it named; None: all configured

    @property
    def reason(self) -> str:
        return self.cancel.reason or "cancelled"


class TurnHandle:
    """A claimed turn: its row, whether this call created it, and its events."""

    def __init__(self, runner: TurnRunner, turn: TurnRow, created: bool) -> None:
        self.runner = runner
        self.turn = turn
        self.created = created

    @property
    def turn_id(self) -> str:
        return self.turn.turn_id

    @property
    def run_id(self) -> str:
        return self.turn.run_id

    def events(self, after_seq: int = 0) -> AsyncIterator[Event]:
        """Replay and tail this turn's events until its terminal event."""
        return self.runner.follow(self.turn_id, after_seq)

    async def wait(self) -> TurnRow:
        """Wait for the turn to end (wherever it runs); returns its final row."""
        running = self.runner._running.get(self.turn_id)
        if running is not None and running.task is not None:
            await asyncio.shield(running.task)
        else:
            async for _ in self.events():
                pass
        return await self.runner.store.get_turn(self.turn_id)

    def cancel(self, reason: str = "cancelled") -> bool:
        return self.runner.cancel(self.turn_id, reason)


class TurnRunner:
    """Runs turns in this process over a shared store. Create it inside the event loop it will use."""

    def __init__(self, store: Store, settings: Settings, *, lm_factory: LMFactory | None = None) -> None:
        self.store = store
        self.settings = settings
        self.lm_factory = lm_factory
        self.hub = EventHub()
        self._writer: EventWriter | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._running: dict[str, _Running] = {}
        self._started = asyncio.Lock()
        self.host_tools = HostTools(settings)  # [[tools]] and [[mcp.servers]] of fleet.toml

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> TurnRunner:
        """Start the event writer and the heartbeat, and mark turns left by dead processes interrupted."""
        async with self._started:
            if self._writer is None:
                telemetry = Telemetry(self.settings)
                self._writer = EventWriter(self.store, self.hub, on_broken=self._events_lost, telemetry=telemetry)
                self._end_interrupted(await self.store.reap_stale_turns())
                self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="fleet-heartbeat")
                asyncio.get_running_loop().run_in_executor(None, sandbox_contract.prepare, self.settings)  # pool
        return self

    async def close(self) -> None:
        """Cancel running turns, wait for their outcome, stop the writer."""
        for turn_id in list(self._running):
            self.cancel(turn_id, "the process running this turn is shutting down")
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S + 2)
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.wait([self._supervisor])  # its store call ends before the store may close
            self._supervisor = None
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        await asyncio.to_thread(self.host_tools.close)  # the MCP servers this process started

    async def reap(self) -> list[EndedTurn]:
        """End the running turns whose owner is gone (see ``Store.reap_stale_turns``), each with its
        terminal event; returns them."""
        await self.open()
        interrupted = await self.store.reap_stale_turns()
        self._end_interrupted(interrupted)
        return interrupted

    def _end_interrupted(self, turns: Iterable[EndedTurn]) -> None:
        """Emit the one terminal event of each turn the store ended for its owner, at the seq reserved for it."""
        assert self._writer is not None
        for turn in turns:
            emitter = TurnEmitter(self._writer, session_id=turn.session_id, turn_id=turn.turn_id, first_seq=turn.seq)
            emitter.emit(TurnFailed(error=turn.error))

    @property
    def store_error(self) -> str | None:
        """Why this process's latest commit of events failed, until one succeeds again."""
        return self._writer.last_error if self._writer is not None else None

    def _events_lost(self, turn_id: str, error: dict[str, Any]) -> None:
        """The writer could not commit events of a turn: stop it, for nothing more of it can be shown."""
        self.cancel(turn_id, error["message"])

    async def _supervise(self) -> None:
        """Heartbeat for our running turns, and pick up durable cancellations (seen within a second)."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if not self._running:
                continue
            try:
                requests = await self.store.beat(self._running)
            except Exception:  # noqa: BLE001 - a store hiccup must not kill the heartbeat
                log.exception("heartbeat failed")
                continue
            for turn_id, reason in requests.items():
                self.cancel(turn_id, reason)

    # ------------------------------------------------------------------ public interface

    async def start(
        self,
        session_id: str,
        task: str,
        *,
        idempotency_key: str | None = None,
        limits: dict[str, Any] | None = None,
        inputs: list[Any] | None = None,
        cell_id: str | None = None,
        supersedes_turn_id: str | None = None,
        skills: list[str] | tuple[str, ...] = (),
        attachment_ids: list[str] | tuple[str, ...] = (),
        output_schema: dict[str, Any] | None = None,
        tools: list[str] | tuple[str, ...] | None = None,
        notebook: Any = None,
    ) -> TurnHandle:
        """Claim and start a turn (or return the one that owns ``idempotency_key``).

        ``limits`` lowers this turn's ``[limits]`` (``max_turn_tokens``, ``max_iters``, ...); none may
        exceed the policy. ``skills`` (at most 4) puts those cards in the turn's prompt;
        ``attachment_ids`` (attachments of the session) are in ``/workspace/files/`` when it starts and
        named to the model; ``output_schema`` (see ``choices.check_output_schema``) makes the model
        submit a ``result`` that satisfies it. ``cell_id`` names the notebook cell the turn runs from
        (Jupyter's ``cellId``): the turn then supersedes that cell's latest turn in the history later
        turns see. ``supersedes_turn_id`` names the replaced turn directly (a turn of this session).
        ``inputs`` (``engine.inputs.NotebookValue``) are the turn's input variables, bound in the sandbox
        under their names. ``tools`` names the host tools (``[[tools]]``, MCP ``<server>__<tool>``) the
        turn may call; None: all configured. ``notebook`` (``kernel.notebook_bridge.NotebookBridge``, from
        ``%%fleet``) adds the notebook's catalogue to the prompt and its host tools (``notebook()``, the
        user's functions).

        Raises:
            ValidationError: empty or oversized task, the key belongs to another task, a limit is
                unknown, invalid or above the policy, an unknown or extra skill, an attachment not of the
                session, an output schema Fleet cannot use, a ``supersedes_turn_id`` that is not a turn of
                the session, a cell id over 200 characters, or a tool that is not configured.
            NotFoundError: unknown session.
            ConflictError: a turn is already running in the session.
        """
        if not task or not task.strip():
            raise ValidationError("the task is empty: write what the model should do")
        if len(task) > MAX_TASK_CHARS:
            raise ValidationError(
                f"the task is {len(task)} characters; the limit is {MAX_TASK_CHARS}. Attach long text as a file"
            )
        if cell_id is not None and not 0 < len(cell_id) <= MAX_CELL_ID_CHARS:
            raise ValidationError(f"a cell id has 1 to {MAX_CELL_ID_CHARS} characters; this one has {len(cell_id)}")
        settings = self.settings.for_turn(limits)
        task = settings.redactor.text(task)  # a key in the task is kept nowhere: turn row, events, history
        catalogue = await asyncio.to_thread(catalogue_for, self.settings)  # a bad card is left out, with a warning
        selected = catalogue.select(skills)
        schema = turn_choices.check_output_schema(output_schema) if output_schema is not None else None
        attachments = await self._attachments(session_id, attachment_ids)
        host_tools = await asyncio.to_thread(self.host_tools.select, tools) if tools is not None else None
        await self.open()
        assert self._writer is not None
        sandbox = await self.sandbox_name()
        # a slot under [sandbox] max_sandboxes, or SandboxBusyError (503) before anything is claimed
        admission = await asyncio.to_thread(sandbox_contract.admit, settings, settings.workspaces_dir / session_id)
        try:
            claim = await self.store.claim_turn(
                session_id,
                task,
                idempotency_key=idempotency_key,
                model=settings.lm_model,
                sandbox=sandbox,
                cell_id=cell_id,
                supersedes_turn_id=supersedes_turn_id,
            )
        except BaseException:
            _release(admission)
            raise
        if claim.interrupted is not None:  # the session's turn whose owner is gone, ended by this claim
            self._end_interrupted([claim.interrupted])
        turn, created = claim
        handle = TurnHandle(self, turn, created)
        if not created:
            _release(admission)
            return handle
        assert claim.session is not None
        settings = session_settings(settings, claim.session)  # its own models
        emitter = TurnEmitter(self._writer, session_id=session_id, turn_id=turn.turn_id, redactor=settings.redactor)
        choices = TurnChoices(skills=selected, output_schema=schema)
        setup_error = None
        try:
            choices.files = await self._place_files(turn, attachments)
        except Exception as exc:  # noqa: BLE001 - the turn is claimed: it fails, with a reason, instead
            log.exception("turn %s: placing its files failed", turn.turn_id)
            setup_error = {"type": "attachment_error", "message": f"the turn's files could not be placed: {exc}"}
        effective = settings.limits
        emitter.emit(
            TurnStarted(
                task=task,
                run_id=turn.run_id,
                model=settings.lm_model,
                sandbox=sandbox,
                limits={
                    "max_iters": effective.max_iters,
                    "max_llm_calls": effective.max_llm_calls,
                    "timeout_s": effective.turn_timeout_s,
                    "exec_timeout_s": effective.exec_timeout_s,
                    "max_turn_tokens": effective.max_turn_tokens,
                    "max_turn_cost_usd": effective.max_turn_cost_usd,
                    "max_tokens": settings.policy.lm.max_tokens,
                    "sub_max_tokens": settings.policy.lm.sub_cap,
                    "max_errors": effective.max_errors,
                },
                cell_id=turn.cell_id,
                supersedes_turn_id=turn.supersedes_turn_id,
                skills=list(selected),
                attachments=[f.event() for f in choices.files],
            ),
        )
        running = _Running(
            turn,
            emitter,
            settings,
            catalogue,
            choices,
            setup_error=setup_error,
            inputs=list(inputs or []),
            notebook=notebook,
            admission=admission,
            host_tools=host_tools,
        )
        self._running[turn.turn_id] = running
        running.task = asyncio.get_running_loop().create_task(self._drive(running), name=f"fleet-{turn.turn_id}")
        return handle

    async def run(
        self,
        session_id: str,
        task: str,
        *,
        idempotency_key: str | None = None,
        limits: dict[str, Any] | None = None,
        **choices: Any,
    ) -> TurnRow:
        """Start a turn and wait for it: the one-call way to run a turn (``choices`` as in ``start``)."""
        handle = await self.start(session_id, task, idempotency_key=idempotency_key, limits=limits, **choices)
        return await handle.wait()

    async def _attachments(self, session_id: str, attachment_ids: list[str] | tuple[str, ...]) -> list[AttachmentRow]:
        """The session's attachments named by a turn, in order. Raises ``ValidationError`` for any other id."""
        ids = list(dict.fromkeys(attachment_ids))
        if ids:
            await self.store.get_session(session_id)  # an unknown session is a 404, as without attachments
        if len(ids) > turn_choices.MAX_ATTACHMENTS:
            raise ValidationError(f"a turn takes at most {turn_choices.MAX_ATTACHMENTS} attachments; got {len(ids)}")
        rows = []
        for attachment_id in ids:
            try:
                row = await self.store.get_attachment(str(attachment_id))
            except NotFoundError:
                row = None
            if row is None or row.session_id != session_id:
                raise ValidationError(
                    f"{str(attachment_id)[:80]!r} is not an attachment of session {session_id}: "
                    "upload it with POST /api/attachments (session_id of this session) first"
                )
            rows.append(row)
        return rows

    async def _place_files(self, turn: TurnRow, rows: list[AttachmentRow]) -> list[turn_choices.TurnFile]:
        """Each attachment of the turn in ``files/``, restored from the store when it is gone or changed."""
        if not rows:
            return []
        workspace = await asyncio.to_thread(Workspace.for_session, self.settings.workspaces_dir, turn.session_id)
        files = []
        for row in rows:
            found = await asyncio.to_thread(turn_choices.file_in_place, workspace, row)
            if found is None:
                data = await self.store.get_blob(row.sha256)
                found = await asyncio.to_thread(turn_choices.place_file, workspace, row, data)
            files.append(found)
        return files

    def follow(self, turn_id: str, after_seq: int = 0, *, quiet_s: float = POLL_INTERVAL_S) -> AsyncIterator[Event]:
        """Replay then tail a turn; ``quiet_s`` as in ``sink.follow``."""
        return follow(self.store, self.hub, turn_id, after_seq, quiet_s=quiet_s)

    def follow_batches(
        self, turn_id: str, after_seq: int = 0, *, quiet_s: float = POLL_INTERVAL_S
    ) -> AsyncIterator[list[Event]]:
        """``follow`` in the batches the events were committed in (one write per batch for a stream)."""
        return follow_batches(self.store, self.hub, turn_id, after_seq, quiet_s=quiet_s)

    def cancel(self, turn_id: str, reason: str = "cancelled") -> bool:
        """Cancel a turn running in this process; thread-safe. Returns false if it does not run here.

        The first reason a turn is cancelled for is the one it ends with.
        """
        running = self._running.get(turn_id)
        if running is None:
            return False
        if not running.cancel.cancel(reason) and running.collecting and running.late is None:
            running.late = reason  # the token ended with the turn's work: what is left (its artifacts) stops now
        return True

    def is_running_here(self, turn_id: str) -> bool:
        return turn_id in self._running

    async def sandbox_name(self) -> str:
        """The backend turns use now; on a thread, as the first call asks bubblewrap (a probe process)."""
        from fleet_kernel.sandbox import choose  # noqa: PLC0415 - the sandbox package loads backends on first use

        return await asyncio.to_thread(choose, self.settings)

    # ------------------------------------------------------------------ the turn

    async def _drive(self, running: _Running) -> None:
        turn = running.turn
        started = time.perf_counter()
        try:
            await self._announced(turn.turn_id)
            if running.setup_error is not None:
                await self._finish(running, Outcome("failed", error=running.setup_error), 0.0)
                return
            job = await self._unless_cancelled(running, self._prepare(running))
            if job is None:  # cancelled while it was prepared (dspy still loading, say): it never runs
                cause = running.cancel.error()
                assert cause is not None
                outcome = stopped(cause)
            else:
                outcome = await self._execute(running, job)
                await self._keep_summary(running, job)
                running.collecting = True  # a cancel from here on stops the collection (see ``cancel``)
                if running.memories is not None and running.memories.changed:
                    await running.memories.mirror()  # after the sandbox handed its copy of the workspace back
                saved = await self._collect_artifacts(running, job, cancelled=outcome.status == "cancelled")
                outcome = _with_artifact_refs(outcome, job, saved)
                if running.late is not None and outcome.status == "completed":
                    outcome = Outcome("cancelled", reason=running.late, usage=outcome.usage)
        except Exception as exc:  # noqa: BLE001 - report any engine failure as turn.failed
            log.exception("turn %s failed in the engine", turn.turn_id)
            outcome = Outcome("failed", error=self._engine_error(exc))
        await self._finish(running, outcome, (time.perf_counter() - started) * 1000)

    def _engine_error(self, exc: Exception) -> dict[str, str]:
        """The turn's error for a failure in the engine; a full disk (an artifact the store had no room
        for) is said as such, naming the disk."""
        if is_disk_full(exc):
            return {"type": "disk_full", "message": describe_write_error(exc, self.store.location)}
        return {"type": type(exc).__name__, "message": str(exc)[:2000]}

    async def _announced(self, turn_id: str) -> None:
        """Let ``turn.started`` reach the store and its watchers before the turn's heavy start-up
        (history, workspace, dspy, sandbox) competes with the event writer for this process."""
        assert self._writer is not None
        try:
            await asyncio.wait_for(self._writer.wait_committed(turn_id, 1), ANNOUNCE_WAIT_S)
        except TimeoutError:
            pass  # a slow store must not hold the turn back

    def _cancelled(self, running: _Running) -> asyncio.Future[None]:
        """A future set when the turn is cancelled (at once if it is already)."""
        loop = asyncio.get_running_loop()
        cancelled: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            # A used-up budget is noticed on the turn's own threads, which then unwind: no hurry for them.
            if not isinstance(running.cancel.error(), BudgetExceeded):
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle, cancelled, None)

        running.cancel.on_cancel(wake)
        return cancelled

    async def _unless_cancelled(self, running: _Running, work: Coroutine[Any, Any, TurnJob]) -> TurnJob | None:
        """What ``work`` returns, or None as soon as the turn is cancelled (``work`` then ends unseen)."""
        task = asyncio.ensure_future(work)
        waiters: set[asyncio.Future[Any]] = {task, self._cancelled(running)}
        await asyncio.wait(waiters, return_when="FIRST_COMPLETED")
        if task.done() and not running.cancel.cancelled:
            return task.result()
        task.add_done_callback(_unseen)
        return None

    async def _prepare(self, running: _Running) -> TurnJob:
        turn = running.turn
        window_turns = running.settings.policy.history.window_turns

        def load() -> tuple[Workspace, str, compaction.Window]:
            # dspy loads (or finishes loading) here, off the loop: it keeps delivering the turn's first events
            import_module("fleet_kernel.engine.turn")
            workspace = Workspace.for_session(self.settings.workspaces_dir, turn.session_id)
            return workspace, workspace.manifest(), compaction.window_for(running.settings)

        history = self.store.history_read(turn.session_id, window=window_turns, before_position=turn.position)
        (workspace, manifest, window), past = await asyncio.gather(asyncio.to_thread(load), history)
        plan = await compaction.plan(self.store, past, window)
        from fleet_kernel.engine.turn import TurnJob  # noqa: PLC0415 - engine.turn imports dspy (~1.5 s), loaded off the event loop

        running.memories = Memories(self.store, running.settings, turn.session_id)
        host_tools = running.host_tools
        if host_tools is None and self.host_tools.configured:  # all of them: the MCP servers start now
            host_tools = await asyncio.to_thread(self.host_tools.select, None)
        return TurnJob(
            settings=running.settings,
            emitter=running.emitter,
            task=turn.task,
            history=plan.text(),
            history_plan=plan,
            workspace=workspace.root,
            workspace_manifest=manifest,
            cancel=running.cancel,
            lm_factory=self.lm_factory,
            inputs=running.inputs,
            catalogue=running.catalogue,
            choices=running.choices,
            tools=[
                *running.memories.tools(asyncio.get_running_loop()),
                *(t.as_dspy() for t in host_tools or ()),
                *(running.notebook.host_tools() if running.notebook else ()),
            ],
            notebook_prompt=running.notebook.prompt if running.notebook else "",
        )

    async def _execute(self, running: _Running, job: TurnJob) -> Outcome:
        # engine.turn imports dspy (~1.5 s), loaded off the event loop
        from fleet_kernel.engine.turn import run_turn  # noqa: PLC0415 - engine.turn imports dspy, loaded off the event loop

        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        if (cause := running.cancel.error()) is not None:  # cancelled as it was prepared: nothing to start
            job.end()
            return stopped(cause)

        def work() -> None:
            try:
                outcome = run_turn(job)
                with contextlib.suppress(RuntimeError):  # a stopped turn unwound after its loop closed
                    loop.call_soon_threadsafe(_settle, done, outcome)
            finally:
                job.end()  # after the outcome is on its way, so the end is never taken for a cancellation

        cancelled = self._cancelled(running)
        context = contextvars.Context()  # a clean context: nothing of the caller's leaks into the turn
        threading.Thread(target=context.run, args=(work,), name=f"fleet-{running.turn.turn_id}", daemon=True).start()
        timeout = job.settings.limits.turn_timeout_s
        waiters: set[asyncio.Future[Any]] = {done, cancelled}
        await asyncio.wait(waiters, timeout=timeout, return_when="FIRST_COMPLETED")
        if done.done():
            return done.result()
        running.cancel.cancel(  # a no-op when something else stopped the turn first
            f"the turn ran past its {timeout:g} s deadline (limits.turn_timeout_s)", TurnDeadlineExceeded
        )
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(done), CANCEL_GRACE_S)
        if job.extracting.is_set():  # the steps gave something: the answer is being extracted from them
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(done), EXTRACT_GRACE_S)
        # The worker is stuck in a call it cannot leave (a slow provider); it will unwind on its own
        # and its late events are dropped because the turn is closed below.
        cause = running.cancel.error()
        assert cause is not None
        return stopped(cause)

    async def _keep_summary(self, running: _Running, job: TurnJob) -> None:
        """Store the session's new history summary, when the turn wrote one (``compaction``), whatever its outcome."""
        folded = job.history_plan.folded if job.history_plan is not None else None
        if folded is None:
            return
        try:
            await self.store.put_history_summary(running.turn.session_id, folded.text, folded.covers, folded.model)
        except Exception:  # noqa: BLE001 - the turn is not the worse for it: the next one folds again
            log.exception("turn %s: its history summary could not be stored", running.turn.turn_id)

    async def _collect_artifacts(
        self, running: _Running, job: TurnJob, *, cancelled: bool
    ) -> dict[str, dict[str, Any]]:
        """Files new or changed under ``artifacts/`` become artifact records and events; returns the
        references (``choices.artifact_ref``) of those collected, by workspace path.

        Sizes are checked before anything is read, each file is read and hashed through one descriptor
        opened without following links, and collection stops at the turn's deadline, or a grace period
        after it for a turn that was stopped (the token is spent by then: the outcome says why it ended).
        """
        turn = running.turn
        storage = self.settings.policy.storage
        max_bytes = int(storage.max_artifact_mb * 1024 * 1024)
        grace = time.monotonic() + CANCEL_GRACE_S
        deadline = grace if cancelled else max(running.started + running.settings.limits.turn_timeout_s, grace)

        def should_stop() -> bool:
            return time.monotonic() > deadline or running.late is not None

        workspace = Workspace(job.workspace)
        saved: dict[str, dict[str, Any]] = {}
        found = await asyncio.to_thread(workspace.files, "artifacts")
        if not found:  # most turns: no store read at all
            return saved
        known = await self.store.latest_artifact_digests(turn.session_id)
        added = 0
        for path, st in found:
            if added >= storage.max_artifacts_per_turn:
                break
            if should_stop():
                log.warning("turn %s: artifact collection stopped (deadline or cancellation)", turn.turn_id)
                break
            if st.st_size > max_bytes:
                log.warning(
                    "turn %s: %s is %d bytes, over storage.max_artifact_mb; not collected",
                    turn.turn_id,
                    path,
                    st.st_size,
                )
                continue
            try:
                changed = await asyncio.to_thread(
                    workspace.read_if_changed, path, st, known.get(path), max_bytes=max_bytes, should_stop=should_stop
                )
            except safe_files.Refused as exc:
                log.warning("turn %s: artifact not collected: %s", turn.turn_id, exc)
                continue
            if changed is None:
                continue
            data, _ = changed
            row = await self.store.add_artifact(
                session_id=turn.session_id, turn_id=turn.turn_id, path=path, mime=guess_mime(path), data=data
            )
            added += 1
            running.emitter.emit(
                Artifact(artifact_id=row.artifact_id, path=row.path, mime=row.mime, size=row.size, sha256=row.sha256)
            )
            saved[row.path] = turn_choices.artifact_ref(row.artifact_id, row.path, row.mime, row.size, row.sha256)
        return saved

    async def _finish(self, running: _Running, outcome: Outcome, duration_ms: float) -> None:
        turn = running.turn
        assert self._writer is not None
        usage = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, **outcome.usage}
        limits = running.settings.limits
        budgets = {"max_turn_tokens": limits.max_turn_tokens, "max_turn_cost_usd": limits.max_turn_cost_usd}
        committed = self._writer.terminal_committed(turn.turn_id)
        lost = self._writer.failure(turn.turn_id)
        if lost is not None:  # events were lost: the turn failed, and the writer records it with its last event
            outcome = Outcome("failed", error=lost, usage=outcome.usage)
        # the row, committed with the terminal event, shows what the turn used against its budgets
        extraction = outcome.extraction_reason if outcome.status == "completed" and outcome.extracted else None
        ending = TurnEnding(
            outcome.status, outcome.answer, outcome.error, {**usage, "budgets": budgets}, outcome.result, extraction
        )
        data: EventData
        if outcome.status == "completed":
            data = TurnCompleted(
                answer=outcome.answer or "",
                usage=usage,
                duration_ms=round(duration_ms, 3),
                extracted=outcome.extracted,
                reason=extraction,
                result=outcome.result,
            )
        elif outcome.status == "cancelled":
            data = TurnCancelledData(reason=outcome.reason or running.reason)
        else:
            data = TurnFailed(error=outcome.error or {"type": "error", "message": "failed"})
        if not running.emitter.lm_reported:  # the contract: every turn reports its LM step, even one never made
            running.emitter.emit(lm_not_sent(running.settings.lm_model))
        running.emitter.emit(data, ending=ending)
        await committed.wait()
        self._running.pop(turn.turn_id, None)
        _release(running.admission)  # a sandbox still stopping frees its slot when it is gone


def _with_artifact_refs(outcome: Outcome, job: TurnJob, saved: dict[str, dict[str, Any]]) -> Outcome:
    """A completed turn's result with its artifact paths (``"format": "artifact"`` in the output schema)
    replaced by references to the artifacts this turn saved there; failed when one names no such artifact."""
    schema = job.choices.output_schema
    if outcome.status != "completed" or schema is None or outcome.result is None:
        return outcome
    if not turn_choices.has_artifacts(schema):
        return outcome
    try:
        result = turn_choices.resolve_artifacts(schema, outcome.result, saved)
    except turn_choices.MissingArtifact as exc:
        error = {"type": "result_artifact_missing", "message": str(exc)}
        return Outcome("failed", error=error, usage=outcome.usage)
    return replace(outcome, result=result)


def _unseen(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of work nobody waits for any more, so a failure of it is not reported as lost."""
    if not task.cancelled():
        task.exception()


def _release(admission: sandbox_contract.Admission | None) -> None:
    if admission is not None:
        admission.release()


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    """Set a future's result unless it has one already (called on the loop, from the turn's thread)."""
    if not future.done():
        future.set_result(value)
