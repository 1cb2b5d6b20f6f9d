"""Turning what dspy.RLM does into Fleet events, as it happens.

``TurnObserver`` is both a dspy callback (modules, LMs, interpreter calls) and the sandbox's observer
(output chunks, host tool calls). Which agent (root or a child RLM built by model code) an event
belongs to is carried by a context variable that flows into dspy's tool threads.

It watches (``observe``) the root RLM's action and extract predictors (``WatchedPredict``), the
turn's LMs and every interpreter the turn's factory makes: all of them call it themselves. A dspy
callback, global or on an instance, costs each call it sees an ``inspect.getcallargs``, a call id and
a handler lookup through ``isinstance`` checks on a ``Protocol`` (~0.1 ms an iteration on the
predictor alone, a global one several times that). Only host tools run with a global callback, for
module events alone (``tool_scope``): that is where dspy's bridge runs a child RLM built by model
code, whose predictors nobody could register beforehand.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.predict.rlm import _strip_code_fences
from dspy.primitives.code_interpreter import CodeExecutionError
from dspy.utils.callback import BaseCallback

from fleet_kernel.cancel import CancelToken
from fleet_kernel.engine.deltas import DeltaCoalescer, FieldSplitter
from fleet_kernel.engine.lm import scrub
from fleet_kernel.engine.metered import reported, take_last_call
from fleet_kernel.engine.sink import TurnEmitter
from fleet_kernel.errors import TooManyErrors, TurnCancelled
from fleet_kernel.events import (
    ROOT_AGENT,
    AgentFinished,
    AgentStarted,
    Code,
    EventData,
    ExecutionFinished,
    IterationStarted,
    LMDelta,
    LMFinished,
    Output,
    Reasoning,
    ToolFinished,
    ToolStarted,
)

PREVIEW_CHARS = 300
THINKING_CHARS = 20_000
"""The provider's thinking text kept on ``lm.finished`` (the rest is cut, with a note)."""


@dataclass
class AgentFrame:
    """One RLM (the root or a child) and where it is in its loop."""

    agent_id: str
    parent_agent_id: str | None
    depth: int
    max_iters: int
    iteration: int = 0
    pending_execution: bool = False


_current_agent: ContextVar[AgentFrame | None] = ContextVar("fleet_current_agent", default=None)
_predict_calls = itertools.count(1)


class WatchedPredict(dspy.Predict):
    """A ``dspy.Predict`` that tells its ``watcher`` of each call as a module callback would be told,
    without dspy's callback wrapper. ``watching`` puts one in place of an RLM's predictor (dspy.RLM
    allows its ``generate_action`` to be replaced). Fleet's turns call their root RLM synchronously;
    ``acall`` is left to dspy's callbacks."""

    watcher: BaseCallback | None = None

    @classmethod
    def watching(cls, predict: dspy.Predict) -> WatchedPredict:
        watched = cls(predict.signature, callbacks=predict.callbacks, **predict.config)
        watched.demos, watched.lm = predict.demos, predict.lm
        return watched

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = functools.partial(super().__call__, *args, **kwargs)
        watcher = self.watcher
        if watcher is None:
            return call()
        call_id = f"predict-{next(_predict_calls)}"
        return reported(
            call, call_id, watcher.on_module_start, watcher.on_module_end, self, {"args": args, "kwargs": kwargs}
        )


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def strip_code(code: str) -> str:
    """The code as dspy.RLM will run it (fences removed)."""
    try:
        stripped: str = _strip_code_fences(code)
        return stripped
    except SyntaxError:
        return code


class ChildLimitExceeded(CodeExecutionError):
    """Raised where model code starts one child RLM too many (or too deep); the model sees it as an error."""


class TurnObserver(BaseCallback):
    """Emits the events of one turn. Thread-safe: dspy calls it from the turn thread and tool threads."""

    def __init__(
        self,
        emitter: TurnEmitter,
        *,
        root_rlm: dspy.RLM,
        root_lm: Any,
        cancel: CancelToken,
        settings: Any,
        max_depth: int,
        max_children: int,
        max_errors: int | None = None,
    ) -> None:
        self.emitter = emitter
        self.root_rlm = root_rlm
        self.root_lm = root_lm
        self.cancel = cancel
        self.settings = settings
        self.max_depth = max_depth
        self.max_children = max_children
        self.children = 0
        self.max_errors = max_errors
        self.failed_in_a_row = 0  # the root's steps whose code failed, since the last that did not
        self.extracted = False
        self.finishing = False  # the turn was stopped and its answer is being extracted: let that call through
        self.last_action: dict[str, Any] = {}  # the inputs of the root's latest step request (its REPL history)
        self.root_finish_reason: str | None = None  # the last root call's: a reply cut at max_tokens fails to parse
        self.usage = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
        self._lock = threading.Lock()
        self._frames_by_predict: dict[int, AgentFrame] = {}
        self._actions: dict[str, AgentFrame] = {}
        self._children: dict[str, tuple[AgentFrame, Any]] = {}
        self._lm_calls: dict[str, tuple[float, Any, AgentFrame]] = {}
        self._attempts: dict[str, int] = {}
        self._executions: dict[str, tuple[AgentFrame, float]] = {}
        self._tool_calls: dict[str, float] = {}
        self._ids = itertools.count(1)
        self.root = AgentFrame(ROOT_AGENT, None, 0, root_rlm.max_iters)
        self._module_events = _ModuleEvents(self)

    # ------------------------------------------------------------------ helpers

    def _frame(self) -> AgentFrame:
        return _current_agent.get() or self.root

    def _emit(self, data: EventData, frame: AgentFrame | None = None) -> None:
        frame = frame or self._frame()
        self.emitter.emit(data, agent_id=frame.agent_id, parent_agent_id=frame.parent_agent_id)

    def check_cancelled(self) -> None:
        if not self.finishing:
            self.cancel.raise_if_cancelled()

    def enter_root(self) -> None:
        """Called on the turn thread before ``forward``: the root agent is current there."""
        _current_agent.set(self.root)
        self._frames_by_predict[id(self.root_rlm.generate_action)] = self.root

    def observe(self, *watched: Any) -> None:
        """Watch each of ``watched`` (predictors, LMs, interpreters): Fleet's own (``WatchedPredict``,
        ``MeteredLM``, the sandbox's interpreters) call this observer themselves (``watcher``), anything
        else gets it as an instance callback."""
        for target in watched:
            if hasattr(target, "watcher"):
                target.watcher = self
            else:
                target.callbacks = [*(getattr(target, "callbacks", None) or []), self]

    def tool_scope(self) -> AbstractContextManager[Any]:
        """Host tools run with this turn's module events on, so a child RLM that dspy's bridge builds
        for model code reports its agent and iterations; its LM calls and executions reach the observer
        from the turn's LMs and interpreters already (``observe``), so they are not seen twice."""
        scope: AbstractContextManager[Any] = dspy.context(
            callbacks=[*(dspy.settings.get("callbacks") or []), self._module_events]
        )
        return scope

    # ------------------------------------------------------------------ modules

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.check_cancelled()
        if isinstance(instance, dspy.RLM) and instance is not self.root_rlm:
            self._start_child(call_id, instance, inputs)
            return
        if instance is self.root_rlm.extract:
            self.extracted = True
        frame = self._frames_by_predict.get(id(instance))
        if frame is self.root:
            self.last_action = dict(inputs.get("kwargs", inputs))
        if frame is not None:
            with self._lock:
                frame.iteration += 1
                self._actions[call_id] = frame
            self._emit(IterationStarted(iteration=frame.iteration, max_iters=frame.max_iters), frame)

    def _start_child(self, call_id: str, instance: dspy.RLM, inputs: dict[str, Any]) -> None:
        parent = self._frame()
        with self._lock:
            self.children += 1
            frame = AgentFrame(f"agent-{next(self._ids)}", parent.agent_id, parent.depth + 1, instance.max_iters)
            self._frames_by_predict[id(instance.generate_action)] = frame
        task = preview({k: v for k, v in (inputs.get("kwargs") or inputs).items() if k != "interpreter_factory"})
        self._emit(
            AgentStarted(agent_id=frame.agent_id, parent_agent_id=parent.agent_id, depth=frame.depth, task=task),
            parent,
        )
        self._children[call_id] = (frame, _current_agent.set(frame))

    def on_module_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        frame = self._actions.pop(call_id, None)
        if frame is not None and exception is None and outputs is not None:
            reasoning = str(getattr(outputs, "reasoning", "") or "")
            code = strip_code(str(getattr(outputs, "code", "") or ""))
            self._emit(Reasoning(iteration=frame.iteration, text=reasoning), frame)
            self._emit(Code(iteration=frame.iteration, code=code), frame)
            frame.pending_execution = True
            return
        child = self._children.pop(call_id, None)
        if child is not None:
            frame, token = child
            parent = AgentFrame(frame.parent_agent_id or ROOT_AGENT, None, frame.depth - 1, 0)
            self._emit(AgentFinished(agent_id=frame.agent_id, ok=exception is None), parent)
            try:
                _current_agent.reset(token)
            except ValueError:  # reset from another context: leave it, the thread ends anyway
                pass

    def check_child_limits(self) -> None:
        """Called where a child RLM asks for its interpreter: refuse one too many or too deep.

        Raised there (not in a callback, whose exceptions dspy swallows) it reaches the model code
        that built the child as an ordinary, recoverable error.
        """
        frame = self._frame()
        if frame.depth > self.max_depth:
            raise ChildLimitExceeded(
                f"child RLMs may nest {self.max_depth} deep (limits.max_depth); solve this level in code"
            )
        if self.children > self.max_children:
            raise ChildLimitExceeded(
                f"this turn already started {self.max_children} child RLMs (limits.max_children); "
                "reuse their results instead of starting more"
            )

    # ------------------------------------------------------------------ LMs

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.check_cancelled()
        self._lm_calls[call_id] = (time.perf_counter(), instance, self._frame())

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        started, instance, frame = self._lm_calls.pop(call_id, (time.perf_counter(), None, self._frame()))
        self._attempts.pop(call_id, None)
        usage, cost, reason, thinking = take_last_call()
        if instance is self.root_lm:
            self.root_finish_reason = reason
        prompt_tokens = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        details = usage.get("completion_tokens_details") or {}
        reasoning_tokens = usage.get("reasoning_tokens") or (details.get("reasoning_tokens") if details else None)
        with self._lock:
            self.usage["lm_calls"] += 1
            self.usage["prompt_tokens"] += prompt_tokens
            self.usage["completion_tokens"] += completion_tokens
            self.usage["cost_usd"] += float(cost or 0.0)
        self._emit(
            LMFinished(
                role="root" if instance is self.root_lm else "sub",
                model=getattr(instance, "model", None),
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
                cost_usd=cost,
                finish_reason=reason,
                reasoning_content=self._shown(thinking, THINKING_CHARS) if thinking else None,
                reasoning_tokens=int(reasoning_tokens) if reasoning_tokens else None,
            ),
            frame,
        )

    def lm_stream(self, call_id: str) -> _CallDeltas:
        """Where an attempt of LM call ``call_id`` streams its reply: ``lm.delta`` events of the frame that
        made it (a retried attempt gets a call id of its own, so watchers start its text afresh)."""
        _, _, frame = self._lm_calls.get(call_id, (0.0, None, self._frame()))
        with self._lock:
            attempts = self._attempts[call_id] = self._attempts.get(call_id, 0) + 1
        attempt_id = call_id if attempts == 1 else f"{call_id}.{attempts}"
        return _CallDeltas(self, frame, attempt_id)

    # ------------------------------------------------------------------ interpreter

    def on_interpreter_execute_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        frame = self._frame()
        if frame.pending_execution:
            frame.pending_execution = False
            self._executions[call_id] = (frame, time.perf_counter())

    def on_interpreter_execute_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        entry = self._executions.pop(call_id, None)
        if entry is None:
            return
        frame, started = entry
        error = None
        if exception is not None and not isinstance(exception, TurnCancelled):
            error = {"type": type(exception).__name__, "message": self._shown(str(exception), 2000)}
        duration_ms = round((time.perf_counter() - started) * 1000, 3)
        self._emit(ExecutionFinished(iteration=frame.iteration, duration_ms=duration_ms, error=error), frame)
        if frame is self.root and not isinstance(exception, TurnCancelled):
            self._count_failure(error, last_step=frame.iteration >= frame.max_iters)

    def _count_failure(self, error: dict[str, str] | None, *, last_step: bool) -> None:
        """Stop the turn when the root's code has failed ``max_errors`` steps in a row: a model stuck on
        one broken approach would spend every iteration left on it. The token is cancelled here, so the
        turn ends at its next LM call (a callback's own exception may be swallowed by dspy). After the last
        step there is nothing left to spare, and dspy.RLM's extraction of an answer follows: not stopped."""
        self.failed_in_a_row = self.failed_in_a_row + 1 if error is not None else 0
        if error is None or self.max_errors is None or self.failed_in_a_row < self.max_errors or last_step:
            return
        lines = error["message"].strip().splitlines()
        last = preview(lines[-1] if lines else error["type"], 300)  # a traceback's last line names the error
        self.cancel.cancel(
            f"the code failed {self.failed_in_a_row} steps in a row (limits.max_errors = {self.max_errors}), so "
            f"the turn was stopped; the last error was {last}. Ask again with more guidance, or raise "
            "limits.max_errors in fleet.toml",
            TooManyErrors,
        )

    # ------------------------------------------------------------------ sandbox observer

    def on_output(self, stream: str, text: str) -> None:
        frame = self._frame()
        self._emit(Output(iteration=frame.iteration, stream=stream, text=scrub(text, self.settings)), frame)

    def _shown(self, value: Any, limit: int = PREVIEW_CHARS) -> str:
        """A preview without secrets, scrubbed before it is cut so that no key is left half shown (every
        event is scrubbed again when emitted)."""
        text = value if isinstance(value, str) else repr(value)
        return preview(scrub(text[: limit + 1024], self.settings), limit)  # what can be shown, plus a key's length

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        self.check_cancelled()
        call_id = f"call-{next(self._ids)}"
        self._tool_calls[call_id] = time.perf_counter()
        shown = ", ".join(
            [self._shown(a, 120) for a in args] + [f"{k}={self._shown(v, 120)}" for k, v in kwargs.items()]
        )
        self._emit(ToolStarted(call_id=call_id, name=name, args_preview=preview(shown)))
        return call_id

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        started = self._tool_calls.pop(call_id, time.perf_counter())
        self._emit(
            ToolFinished(
                call_id=call_id,
                ok=ok,
                result_preview=self._shown(result),
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )
        )


class _CallDeltas:
    """One streamed attempt of an LM call: its reply split by field (``FieldSplitter``) and coalesced into
    ``lm.delta`` events (``DeltaCoalescer``), holding back the start of a secret until it is clear."""

    def __init__(self, observer: TurnObserver, frame: AgentFrame, call_id: str) -> None:
        self.observer = observer
        self.frame = frame
        self.call_id = call_id
        self.iteration = frame.iteration
        self.splitter = FieldSplitter()
        self.coalescer = DeltaCoalescer(self._flush, hold=observer.settings.redactor.unsafe_tail)

    def text(self, text: str) -> None:
        for name, piece in self.splitter.feed(text):
            self.coalescer.add(name, piece)

    def thinking(self, text: str) -> None:
        """The provider's thinking, as it comes (``lm.finished`` carries it whole, too)."""
        self.coalescer.add("thinking", text)

    def close(self) -> None:
        self.coalescer.close()

    def _flush(self, name: str, text: str) -> None:
        delta = LMDelta(iteration=self.iteration, call_id=self.call_id, field=name, text=text)
        self.observer._emit(delta, self.frame)


class _ModuleEvents(BaseCallback):
    """The observer's module events alone: the global callback inside host tools (``tool_scope``)."""

    def __init__(self, observer: TurnObserver) -> None:
        self.observer = observer

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.observer.on_module_start(call_id, instance, inputs)

    def on_module_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        self.observer.on_module_end(call_id, outputs, exception)
