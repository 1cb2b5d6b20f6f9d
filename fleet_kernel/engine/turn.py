"""One turn's dspy.RLM run, on its worker thread: build LMs and sandbox, run, map the outcome.

Everything here is synchronous and may import dspy; the async side (``runner.py``) only waits for it,
so the caller's event loop stays free and the kernel starts without importing dspy.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

import dspy
from dspy.primitives.code_interpreter import CodeInterpreterError
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.exceptions import LMError as DSPyLMError

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import Settings
from fleet_kernel.engine.budget import TurnBudget
from fleet_kernel.engine.choices import TurnChoices, files_prompt, result_type, schema_prompt
from fleet_kernel.engine.compaction import HistoryPlan, first_text
from fleet_kernel.engine.images import ImageChatAdapter, look_tool, turn_images, with_image_queries
from fleet_kernel.engine.lm import build_lms, explain_lm_error, scrub
from fleet_kernel.engine.observe import TurnObserver, WatchedPredict
from fleet_kernel.engine.outcome import Outcome, stopped
from fleet_kernel.engine.reask import ReaskingChatAdapter
from fleet_kernel.engine.sink import TurnEmitter
from fleet_kernel.errors import ConfigError, FleetError, LMError, TurnCancelled
from fleet_kernel.events import lm_not_sent
from fleet_kernel.sandbox import base as sandbox_base
from fleet_kernel.sandbox import open_sandbox
from fleet_kernel.skills import Catalogue
from fleet_kernel.workspace import take_unsaved

log = logging.getLogger(__name__)


class FleetTask(dspy.Signature):
    """Do the user's task for this turn (the variable `task`) in Python; answer in Markdown."""

    task: str = dspy.InputField(desc="what the user asks in this turn")
    answer: str = dspy.OutputField(desc="the final answer for the user, in Markdown")


HISTORY_FIELD = dspy.InputField(desc="earlier turns of this session (task and answer), oldest first")
HISTORY_SUMMARY_FIELD = dspy.InputField(
    desc="earlier turns of this session, oldest first: a summary of the older ones, then the latest (task and answer)"
)
HISTORY_PROMPT = "Earlier turns of this session are in `history`; the user may refer to them."
WORKSPACE_FIELD = dspy.InputField(desc="what /workspace holds right now")
WORKSPACE_PROMPT = "`workspace` lists what the session's /workspace holds (it outlives the turn)."
"""Inputs a turn has only when they say something: a first turn, or a session with an empty folder, gets no
``history`` or ``workspace`` field and no words about them (a small model took an empty one for the task)."""


LMFactory = Callable[[Settings], tuple[Any, Any]]


@dataclass
class TurnJob:
    """What the worker thread needs; ``cancel`` is the turn's token, shared with the async side.

    Cancelling it stops the turn: the observer and the sandbox raise ``TurnCancelled``, the sandbox's
    running code is interrupted and the budget closes the LM requests in flight.
    """

    settings: Settings
    emitter: TurnEmitter
    task: str
    history: str  # "" on a session's first turn: no ``history`` input then
    workspace: Path
    workspace_manifest: str  # "" for an empty workspace: no ``workspace`` input then
    cancel: CancelToken
    lm_factory: LMFactory | None = None
    inputs: list[Any] = field(default_factory=list)  # engine.inputs.NotebookValue, sent to the sandbox once
    catalogue: Catalogue = field(default_factory=lambda: Catalogue({}))
    choices: TurnChoices = field(default_factory=TurnChoices)
    tools: list[Callable[..., Any]] = field(default_factory=list)  # more host tools for sandbox code (memory)
    notebook_prompt: str = ""  # a %%fleet turn: the notebook's variables, recent cells and tools (kernel.namespace)
    unlisted_tools: frozenset[str] = frozenset()  # callable, but not described: nothing for them to act on yet
    budget: TurnBudget = field(init=False)
    extracting: threading.Event = field(default_factory=threading.Event)  # set: a stopped turn extracts its answer
    history_plan: HistoryPlan | None = None  # its older turns to fold into the session's summary first (compaction)

    def __post_init__(self) -> None:
        self.budget = TurnBudget.for_limits(self.settings.limits, self.cancel)

    def end(self) -> None:
        """The turn is over: no LM call starts for it any more (a tool thread's, a child RLM's), and
        whatever still runs ends now, even a call that began just as the turn was stopped."""
        self.cancel.cancel("the turn has ended")
        self.budget.close()


class _GuardedFactory:
    """The backend's factory, refusing interpreters for child RLMs past the turn's limits (``observer``'s)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.observer: TurnObserver | None = None
        self.execution_instructions = inner.execution_instructions

    def __call__(self) -> Any:
        if self.observer is None:
            return self._inner()
        self.observer.check_child_limits()
        interpreter = self._inner()
        self.observer.observe(interpreter)
        return interpreter


UNPARSED_SHOWN_CHARS = 1500
"""How much of a reply that could not be parsed the turn's error quotes (what the model said)."""


def _failure(exc: BaseException, settings: Settings, finish_reason: str | None = None) -> Outcome:
    if isinstance(exc, FleetError):
        return Outcome("failed", error={"type": exc.code, "message": scrub(exc.message, settings)})
    if isinstance(exc, DSPyLMError) or type(exc).__module__.startswith(("litellm", "openai", "httpx")):
        err = explain_lm_error(exc, settings)
        return Outcome("failed", error={"type": err.code, "message": err.message})
    if isinstance(exc, AdapterParseError):
        return Outcome("failed", error={"type": "lm_parse_error", "message": _unparsed(exc, settings, finish_reason)})
    if isinstance(exc, CodeInterpreterError):
        message = f"the sandbox failed and the turn could not go on: {scrub(str(exc), settings)}"
        return Outcome("failed", error={"type": "sandbox_error", "message": message})
    log.exception("turn failed unexpectedly")
    return Outcome("failed", error={"type": type(exc).__name__, "message": scrub(str(exc), settings)[:2000]})


def _unparsed(exc: AdapterParseError, settings: Settings, finish_reason: str | None) -> str:
    """Why the model's reply could not be used, and what it said: its fields as far as they parsed, else the
    reply itself, bounded and without secrets."""
    if finish_reason == "length":
        cap = settings.policy.lm.max_tokens
        why = (
            f"the reply was cut at the completion cap ({cap} tokens, `[lm] max_tokens` in fleet.toml) before it "
            "was complete; raise `[lm] max_tokens`, or ask for less at once"
        )
    else:
        why = "try a stronger model (FLEET_LM_MODEL) or ask again"
    parsed = exc.parsed_result if isinstance(exc.parsed_result, dict) else {}
    fields = {name: str(text) for name, text in parsed.items() if str(text or "").strip()}
    if fields:
        said = "\n".join(f"{name}: {text}" for name, text in fields.items())
        heading = "What the model said, as far as it parsed"
    else:
        said, heading = str(exc.lm_response or "").strip() or "(nothing)", "What the model said"
    if len(said) > UNPARSED_SHOWN_CHARS:
        said = f"{said[:UNPARSED_SHOWN_CHARS]}... ({len(said) - UNPARSED_SHOWN_CHARS} more characters)"
    return (
        f"the model's reply could not be parsed into reasoning and code, also when asked again with the error; "
        f"{why}. {heading}:\n{scrub(said, settings)}"
    )


def _present(**inputs: str) -> dict[str, str]:
    """The optional inputs that say something (``turn_signature`` gives only those a field)."""
    return {name: text for name, text in inputs.items() if text}


def _scrubbed(value: Any, settings: Settings) -> Any:
    """A result with every configured secret removed from its strings."""
    if isinstance(value, str):
        return scrub(value, settings)
    if isinstance(value, dict):
        return {scrub(str(k), settings): _scrubbed(v, settings) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrubbed(v, settings) for v in value]
    return value


class FleetRLM(dspy.RLM):
    """``dspy.RLM`` whose prompt lists the host tools as the Python calls they are.

    dspy writes each as ``remember(content: string, kind: string)``: JSON Schema types that are noise for
    text and hide the defaults. Here it is ``remember(content, kind="note")``, a type shown only where it is
    not a string and there is no default; a prompt ~25 tokens shorter, read on every step. Tools named in
    ``unlisted`` are callable all the same, only not described while they have nothing to act on
    (``read_skill_resource`` when no card lists a resource, ``search_memories`` and ``forget`` in a session
    without memories): an empty store adds no text, as an empty history adds no input.
    """

    def __init__(self, *args: Any, unlisted: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        self._unlisted = unlisted  # before dspy.RLM's __init__, which builds the prompt
        super().__init__(*args, **kwargs)

    def _format_tool_docs(self, tools: dict[str, dspy.Tool]) -> str:
        listed = [tool for name, tool in tools.items() if name not in self._unlisted]
        if not listed:
            return ""
        lines = ["\nAdditional tools available (use these instead of standard library equivalents):"]
        for tool in listed:
            desc = (tool.desc or "No description").replace("\n", "  ")
            lines.append(f"- `{tool.name}({', '.join(_param(n, s) for n, s in (tool.args or {}).items())})` - {desc}")
        return "\n".join(lines)


def _param(name: str, schema: dict[str, Any]) -> str:
    if "default" in schema:
        return f"{name}={json.dumps(schema['default'], ensure_ascii=False)}"
    kind = schema.get("type")
    return name if kind in (None, "string") else f"{name}: {kind}"


_TOOL_SPECS: dict[CodeType, dspy.Tool] = {}


def as_tool(func: Callable[..., Any]) -> dspy.Tool:
    """``func`` as a ``dspy.Tool``, its argument schema parsed once per function definition.

    Each turn's host tools are new closures of the same code, and parsing (a pydantic ``TypeAdapter``
    per argument) costs ~0.4 ms a tool; a copy with the new function costs ~15 us.
    """
    if isinstance(func, dspy.Tool):  # a host tool of fleet.toml, described already (engine.host_tools)
        return func
    code = getattr(func, "__code__", None)
    if hasattr(func, "__wrapped__"):  # a user's function behind one wrapper's code: parsed each time
        return dspy.Tool(func)
    spec = _TOOL_SPECS.get(code) if isinstance(code, CodeType) else None
    if spec is None:
        spec = dspy.Tool(func)
        if isinstance(code, CodeType):
            _TOOL_SPECS[code] = spec
        return spec
    return spec.model_copy(update={"func": func})


def base_instructions(settings: Settings) -> str:
    """``[lm] instructions`` (a file, as ``fleet optimize`` writes it), else ``FleetTask``'s own.

    Raises:
        ConfigError: the file cannot be read or is empty.
    """
    path = settings.policy.lm.instructions
    if path is None:
        return str(FleetTask.instructions)
    try:
        text = path.expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"[lm] instructions: cannot read {path}: {exc}") from exc
    if not text:
        raise ConfigError(f"[lm] instructions: {path} is empty; point it at a file of instructions, or remove it")
    return text


def turn_signature(job: TurnJob) -> type[dspy.Signature]:
    """``FleetTask`` with this turn's skills catalogue, preselected cards, files and output schema."""
    choices = job.choices
    parts = [
        base_instructions(job.settings),
        HISTORY_PROMPT if job.history else "",
        WORKSPACE_PROMPT if job.workspace_manifest else "",
        job.catalogue.prompt(choices.skills) if job.catalogue.skills else "",
        files_prompt(choices.files),
        job.notebook_prompt,
    ]
    if choices.output_schema is not None:
        parts.append(schema_prompt(choices.output_schema))
    signature: type[Any] = FleetTask.with_instructions("\n\n".join(p for p in parts if p))
    if job.history:
        summarised = job.history_plan is not None and job.history_plan.older > 0
        signature = signature.append("history", HISTORY_SUMMARY_FIELD if summarised else HISTORY_FIELD, type_=str)
    if job.workspace_manifest:
        signature = signature.append("workspace", WORKSPACE_FIELD, type_=str)
    if choices.output_schema is not None:
        desc = "the structured result, a dict that satisfies the output schema"
        typed = result_type(choices.output_schema, should_stop=lambda: job.cancel.cancelled)
        signature = signature.append("result", dspy.OutputField(desc=desc), type_=typed)
    return signature


EXTRACTED_ON = {"deadline_exceeded": "deadline", "budget_exceeded": "budget"}
"""The stops after which a turn ends with the answer extracted from its steps, when it took any (the reason
``turn.completed`` gives); any other stop (a cancel, ``max_errors``) ends it as before."""


def _extract_after_stop(job: TurnJob, cause: TurnCancelled, observer: TurnObserver | None, rlm: Any) -> Outcome | None:
    """The turn reached its deadline or budget: its best answer so far, extracted by one more root request (as
    dspy.RLM does at ``max_iters``) from the steps that ran, or None when there were none or extraction failed.

    That request is made on a fresh copy of the root model, past the budget and the deadline: one call,
    capped at ``[lm] max_tokens`` (asked again once if its reply cannot be parsed), counted in the turn's usage.
    """
    reason = EXTRACTED_ON.get(str(getattr(cause, "code", "")))
    history = observer.last_action.get("repl_history") if observer is not None else None
    if reason is None or observer is None or rlm is None or not history:
        return None
    settings = job.settings
    job.extracting.set()  # the runner waits a little longer for this turn's outcome
    try:
        fresh, _ = (job.lm_factory or build_lms)(settings)
        lm = fresh.copy()
        observer.root_lm, observer.finishing = lm, True
        observer.observe(lm)
        with dspy.context(lm=lm, max_trace_size=0, adapter=ReaskingChatAdapter()):
            prediction = rlm.extract(variables_info=observer.last_action.get("variables_info"), repl_history=history)
        return Outcome(
            "completed",
            answer=scrub(str(prediction.answer), settings),
            extracted=True,
            extraction_reason=reason,
            usage=observer.usage,
            result=_scrubbed(getattr(prediction, "result", None), settings),
        )
    except BaseException:  # noqa: BLE001 - no answer to give: the turn fails with its stop's error, as before
        log.warning("turn stopped (%s): extracting an answer from its steps failed", reason, exc_info=True)
        return None


def _folded_history(job: TurnJob, sub_lm: Any) -> str:
    """The turn's history, its older turns first folded into the session's summary by one sub-LM call when
    the window left some behind (``engine/compaction.py``); when that call fails, the history as it stands.

    ``history`` (the text the signature was built for) is never empty when there is something to fold.
    """
    plan = job.history_plan
    if plan is None or not plan.needs_folding:
        return job.history
    try:
        plan.fold(lambda messages: first_text(sub_lm(messages=messages)), getattr(sub_lm, "model", None), job.settings)
    except TurnCancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - the turn goes on without the new summary; the next one tries again
        log.warning("summarising the session's older turns failed: %s", scrub(str(exc), job.settings)[:500])
        return job.history
    return plan.text()


def run_turn(job: TurnJob) -> Outcome:
    """Run one dspy.RLM turn to its outcome. Never raises; ``end`` the job after it.

    A turn whose sandbox wrote files the workspace could not take (a full disk) fails, saying which.
    """
    take_unsaved(job.workspace)  # what a sandbox stopped after an earlier turn lost was that turn's (logged)
    outcome = _run(job)
    unsaved = take_unsaved(job.workspace)
    if unsaved is None:
        return outcome
    error = unsaved.error(job.workspace)
    return Outcome("failed", error={**error, "message": scrub(error["message"], job.settings)}, usage=outcome.usage)


def _run(job: TurnJob) -> Outcome:
    settings = job.settings
    limits = settings.limits
    try:
        root_lm, sub_lm = (job.lm_factory or build_lms)(settings)
    except LMError as exc:
        # The contract: every turn reports its LM step, even one that could not start.
        job.emitter.emit(lm_not_sent(settings.lm_model))
        return _failure(exc, settings)

    # copies: the observer registers on them, and a factory's LMs may serve other turns too
    root_lm, sub_lm = root_lm.copy(), sub_lm.copy()
    job.budget.watch(root_lm, sub_lm)
    sandbox = None
    observer: TurnObserver | None = None
    rlm: Any = None
    try:
        sandbox = open_sandbox(settings, job.workspace, cancel=job.cancel)  # interrupted when the token is cancelled
        signature: Any = turn_signature(job)
        for value in job.inputs:
            signature = signature.append(
                value.name, dspy.InputField(desc="a value from the user's notebook"), type_=type(value)
            )
        factory = _GuardedFactory(sandbox)
        images = turn_images(job.inputs, job.choices.files, job.workspace)  # --in images, image attachments
        rlm = FleetRLM(
            signature,
            # given here, not only to forward(): RLM then builds its action signature once, where a factory
            # it first meets in forward() has it rebuild the signature (a pydantic model) every iteration
            interpreter_factory=factory,
            max_iters=limits.max_iters,
            max_llm_calls=limits.max_llm_calls,
            max_output_chars=limits.max_output_chars,
            sub_lm=sub_lm,
            tools=[
                as_tool(f)
                for f in [
                    *(job.catalogue.tools() if job.catalogue.skills else []),
                    *job.tools,
                    look_tool(images, job.workspace),
                ]
            ],
            unlisted=job.unlisted_tools | (frozenset() if job.catalogue.has_resources() else {"read_skill_resource"}),
        )
        with_image_queries(rlm, job.workspace)  # llm_query(prompt, images=[...])
        observer = TurnObserver(
            job.emitter,
            root_rlm=rlm,
            root_lm=root_lm,
            cancel=job.cancel,
            settings=settings,
            max_depth=limits.max_depth,
            max_children=limits.max_children,
            max_errors=limits.max_errors,
        )
        rlm.generate_action = WatchedPredict.watching(rlm.generate_action)
        rlm.extract = WatchedPredict.watching(rlm.extract)
        observer.observe(rlm.generate_action, rlm.extract, root_lm, sub_lm)
        factory.observer = observer
        sandbox_base.observer.set(observer)
        # max_trace_size=0: dspy keeps every predictor call (module, inputs, prediction) in a process-wide
        # trace of 10 000 for optimizers; a kernel or server running turn after turn held every turn alive
        # adapter: a reply that cannot be parsed is asked again once, with the error (engine/reask.py)
        with dspy.context(lm=root_lm, max_trace_size=0, adapter=ImageChatAdapter(images)):
            observer.enter_root()
            history = _folded_history(job, sub_lm)
            prediction = rlm(
                task=job.task,
                **_present(history=history, workspace=job.workspace_manifest),
                **{value.name: value for value in job.inputs},
                interpreter_factory=factory,
            )
        return Outcome(
            "completed",
            answer=scrub(str(prediction.answer), settings),
            extracted=observer.extracted,
            extraction_reason="max_iters" if observer.extracted else None,
            usage=observer.usage,
            result=_scrubbed(getattr(prediction, "result", None), settings),
        )
    except BaseException as exc:  # noqa: BLE001 - every failure becomes turn.failed, with a readable message
        usage = observer.usage if observer else {}
        # Whatever surfaced once the turn was stopped (TurnCancelled, an LM call cut short, a killed
        # sandbox), the token's first reason decides how the turn ends.
        cause = job.cancel.error() or (exc if isinstance(exc, TurnCancelled) else None)
        if cause is not None:
            extracted = _extract_after_stop(job, cause, observer, rlm)
            return extracted or stopped(cause, usage)
        outcome = _failure(exc, settings, observer.root_finish_reason if observer else None)
        outcome.usage = usage
        return outcome
    finally:
        if sandbox is not None:
            try:
                sandbox.close()
            except Exception:  # noqa: BLE001 - closing must not mask the outcome
                log.exception("closing the sandbox failed")
