"""``TurnRunner``: start, watch, cancel and finish turns; the one engine both front doors call.

A turn is claimed in the store (idempotency key, one running turn per session), announced with
``turn.started`` at once, then run by ``engine.turn.run_turn`` on its own thread while this side
waits for the outcome, a cancellation (in-process, or durable from the store) or the deadline.
What prepares a turn (its task, files and job) is ``prepare``; what finishes it (its history summary,
artifacts and terminal event) is ``finish``. This module imports no dspy, so a kernel can start before
dspy is loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from fleet_kernel.config import Settings
from fleet_kernel.engine import choices as turn_choices
from fleet_kernel.engine.budget import BudgetExceeded
from fleet_kernel.engine.choices import TurnChoices
from fleet_kernel.engine.finish import collect_artifacts, keep_summary, terminal, with_artifact_refs
from fleet_kernel.engine.host_tools import HostTool, HostTools
from fleet_kernel.engine.outcome import Outcome, stopped
from fleet_kernel.engine.prepare import check_task, place_files, prepare_job, turn_attachments
from fleet_kernel.engine.running import CANCEL_GRACE_S, RunningTurn
from fleet_kernel.engine.session_config import session_settings
from fleet_kernel.engine.sink import POLL_INTERVAL_S, EventHub, EventWriter, TurnEmitter, follow, follow_batches
from fleet_kernel.errors import TurnCancelled, TurnDeadlineExceeded
from fleet_kernel.events import (
    Event,
    TurnFailed,
    TurnStarted,
    lm_not_sent,
)
from fleet_kernel.sandbox import contract as sandbox_contract
from fleet_kernel.skills import Catalogue, catalogue_for
from fleet_kernel.store import EndedTurn, Store, TurnRow, describe_write_error, is_disk_full
from fleet_kernel.telemetry import Telemetry

if TYPE_CHECKING:
    from fleet_kernel.engine.turn import LMFactory, TurnJob

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
EXTRACT_GRACE_S = 30.0
"""Past the deadline, how long a turn may still take to extract its answer from its steps: at least this, and
as long as the extraction's one root request may take (``[lm] request_timeout_s``). A local model on a busy
CPU took 60-130 s to read the ~2,700-token extraction prompt; cut at 30 s, such a turn failed with no answer."""
ANNOUNCE_WAIT_S = 0.25


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
        self._open_writer: EventWriter | None = None  # from ``open`` until ``close``
        self._supervisor: asyncio.Task[None] | None = None
        self._running: dict[str, RunningTurn] = {}
        self._started = asyncio.Lock()
        self._unannounced = 0  # turns being started whose ``turn.started`` is not committed yet
        self._all_announced = asyncio.Event()  # set while that is none
        self._all_announced.set()
        self.host_tools = HostTools(settings)  # [[tools]] and [[mcp.servers]] of fleet.toml

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> TurnRunner:
        """Start the event writer and the heartbeat, and mark turns left by dead processes interrupted."""
        async with self._started:
            if self._open_writer is None:
                telemetry = Telemetry(self.settings)
                self._open_writer = EventWriter(self.store, self.hub, on_broken=self._events_lost, telemetry=telemetry)
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
        if self._open_writer is not None:
            await self._open_writer.close()
            self._open_writer = None
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
        for turn in turns:
            emitter = TurnEmitter(self._writer, session_id=turn.session_id, turn_id=turn.turn_id, first_seq=turn.seq)
            emitter.emit(TurnFailed(error=turn.error))

    @property
    def store_error(self) -> str | None:
        """Why this process's latest commit of events failed, until one succeeds again."""
        return self._open_writer.last_error if self._open_writer is not None else None

    @property
    def _writer(self) -> EventWriter:
        """The event writer ``open`` started; every turn's events go through it."""
        if self._open_writer is None:
            raise RuntimeError("the turn runner is not open: await runner.open() first (or it was closed)")
        return self._open_writer

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
        self._unannounced += 1
        self._all_announced.clear()
        count_ends_here = True  # unless the turn goes to its drive, which ends it once turn.started is committed
        try:
            check_task(task, cell_id)
            settings = self.settings.for_turn(limits)
            task = settings.redactor.text(task)  # a key in the task is kept nowhere: turn row, events, history
            schema = turn_choices.check_output_schema(output_schema) if output_schema is not None else None
            attachments = await turn_attachments(self.store, session_id, attachment_ids)
            await self.open()
            catalogue, selected, host_tools, sandbox, admission = await asyncio.to_thread(
                self._before_claim, settings, session_id, skills, tools
            )
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
            if claim.session is None:  # not created: the turn of this idempotency key, claimed before
                _release(admission)
                return handle
            settings = session_settings(settings, claim.session)  # its own models
            emitter = TurnEmitter(self._writer, session_id=session_id, turn_id=turn.turn_id, redactor=settings.redactor)
            choices = TurnChoices(skills=selected, output_schema=schema)
            setup_error = None
            try:
                choices.files = await place_files(self.store, self.settings.workspaces_dir, turn, attachments)
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
            running = RunningTurn(
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
            count_ends_here = False
            return handle
        finally:
            if count_ends_here:
                self._announce_done()

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

    def _before_claim(
        self,
        settings: Settings,
        session_id: str,
        skills: list[str] | tuple[str, ...],
        tools: list[str] | tuple[str, ...] | None,
    ) -> tuple[Catalogue, tuple[str, ...], list[HostTool] | None, str, sandbox_contract.Admission | None]:
        """What a turn needs before its claim that reads files or asks bubblewrap, in one thread hop (each hop
        waits for the GIL behind the turns already running): the skills catalogue (a bad card is left out, with
        a warning) and those chosen, the host tools named, the backend, and last its slot under ``[sandbox]
        max_sandboxes`` (``SandboxBusyError``, a 503, before anything is claimed)."""
        catalogue = catalogue_for(self.settings)
        selected = catalogue.select(skills)
        host_tools = self.host_tools.select(tools) if tools is not None else None
        sandbox = sandbox_contract.choose(settings)
        return (
            catalogue,
            selected,
            host_tools,
            sandbox,
            sandbox_contract.admit(settings, settings.workspaces_dir / session_id),
        )

    async def sandbox_name(self) -> str:
        """The backend turns use now; on a thread, as the first call asks bubblewrap (a probe process)."""
        return await asyncio.to_thread(sandbox_contract.choose, self.settings)

    # ------------------------------------------------------------------ the turn

    async def _drive(self, running: RunningTurn) -> None:
        turn = running.turn
        started = time.perf_counter()
        try:
            await self._announced(turn.turn_id)
            if running.setup_error is not None:
                await self._finish(running, Outcome("failed", error=running.setup_error), 0.0)
                return
            job = await self._unless_cancelled(
                running,
                prepare_job(self.store, self.settings.workspaces_dir, self.host_tools, self.lm_factory, running),
            )
            if isinstance(job, TurnCancelled):  # cancelled while it was prepared (dspy still loading, say)
                outcome = stopped(job)  # it never runs
            else:
                outcome = await self._execute(running, job)
                await keep_summary(self.store, running, job)
                running.collecting = True  # a cancel from here on stops the collection (see ``cancel``)
                if running.memories is not None and running.memories.changed:
                    await running.memories.mirror()  # after the sandbox handed its copy of the workspace back
                saved = await collect_artifacts(
                    self.store, self.settings, running, job, cancelled=outcome.status == "cancelled"
                )
                outcome = with_artifact_refs(outcome, job, saved)
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
        """Let ``turn.started`` reach the store and its watchers before the turn's heavy start-up (history,
        workspace, dspy, sandbox) competes with the event writer for this process; and that of the turns being
        started beside it (a burst of requests), so that none of them waits for its first event behind the
        others' start-ups. At most ``ANNOUNCE_WAIT_S`` in all: a slow store, or a stream of new turns, must not
        hold the turn back."""

        async def announced() -> None:
            try:
                await self._writer.wait_committed(turn_id, 1)
            finally:
                self._announce_done()
            await self._all_announced.wait()

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(announced(), ANNOUNCE_WAIT_S)

    def _announce_done(self) -> None:
        self._unannounced -= 1
        if not self._unannounced:
            self._all_announced.set()

    def _cancelled(self, running: RunningTurn) -> asyncio.Future[None]:
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

    async def _unless_cancelled(
        self, running: RunningTurn, work: Coroutine[Any, Any, TurnJob]
    ) -> TurnJob | TurnCancelled:
        """What ``work`` returns, or what the turn stops with as soon as it is cancelled (``work`` then
        ends unseen)."""
        task = asyncio.ensure_future(work)
        waiters: set[asyncio.Future[Any]] = {task, self._cancelled(running)}
        await asyncio.wait(waiters, return_when="FIRST_COMPLETED")
        cause = running.cancel.error()
        if cause is None:  # not cancelled, so the wait ended because the work is done
            return task.result()
        task.add_done_callback(_unseen)
        return cause

    async def _execute(self, running: RunningTurn, job: TurnJob) -> Outcome:
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
        cause = running.cancel.cancelled_with(  # the first cause when something else stopped the turn first
            f"the turn ran past its {timeout:g} s deadline (limits.turn_timeout_s)", TurnDeadlineExceeded
        )
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(done), CANCEL_GRACE_S)
        if job.extracting.is_set():  # the steps gave something: the answer is being extracted from them
            with contextlib.suppress(TimeoutError):
                grace = max(EXTRACT_GRACE_S, job.settings.policy.lm.request_timeout_s)
                return await asyncio.wait_for(asyncio.shield(done), grace)
        # The worker is stuck in a call it cannot leave (a slow provider); it will unwind on its own
        # and its late events are dropped because the turn is closed below.
        return stopped(cause)

    async def _finish(self, running: RunningTurn, outcome: Outcome, duration_ms: float) -> None:
        turn = running.turn
        committed = self._writer.terminal_committed(turn.turn_id)
        lost = self._writer.failure(turn.turn_id)
        if lost is not None:  # events were lost: the turn failed, and the writer records it with its last event
            outcome = Outcome("failed", error=lost, usage=outcome.usage)
        data, ending = terminal(running, outcome, duration_ms)
        if not running.emitter.lm_reported:  # the contract: every turn reports its LM step, even one never made
            running.emitter.emit(lm_not_sent(running.settings.lm_model))
        running.emitter.emit(data, ending=ending)
        await committed.wait()
        self._running.pop(turn.turn_id, None)
        _release(running.admission)  # a sandbox still stopping frees its slot when it is gone


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
