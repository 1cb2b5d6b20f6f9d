"""The event vocabulary: every step of a turn as one typed, versioned envelope.

Defined once here and imported by the engine (emits), the store (keeps), the API (streams over SSE),
the kernel (renders) and the notebook export (transcribes). Each event's data is one class carrying its
``type``; code emits instances, and the registry and docs/events.md's table are built from the classes.
``make_event`` validates the data, so a missing or unknown field fails loudly instead of travelling as a
dict, and makes its text ``terminal_safe``: events carry what sandboxed code printed and what the model wrote
to terminals and ``text/plain`` outputs, where control sequences would act on the user's terminal.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict

from fleet_kernel.textsafe import terminal_safe_data

ENVELOPE_VERSION = 1


class _Data(BaseModel):
    # validate_assignment: an instance changed after it was built stays valid, so it is dumped as is
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ErrorInfo(_Data):
    type: str
    message: str


class TurnLimits(_Data):
    max_iters: int
    max_llm_calls: int
    timeout_s: float
    exec_timeout_s: float
    max_turn_tokens: int | None = None
    """Prompt plus completion tokens over all LM calls of the turn (``limits.max_turn_tokens``)."""
    max_turn_cost_usd: float | None = None
    """LM cost of the turn, when set (``limits.max_turn_cost_usd``)."""
    max_tokens: int | None = None
    """Completion cap sent with each root LM call (``lm.max_tokens``)."""
    sub_max_tokens: int | None = None
    """Completion cap sent with each ``llm_query`` and child RLM call (``lm.sub_max_tokens``)."""
    max_errors: int | None = None
    """Steps in a row whose code may fail before the turn stops (``limits.max_errors``); null: no limit."""


class LMUsage(_Data):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TurnUsage(_Data):
    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class TurnFileInfo(_Data):
    """An attachment in `/workspace/files/` for this turn; `renamed` when it was placed under a suffixed
    name because another file held its own."""

    attachment_id: str
    name: str
    path: str
    size: int
    sha256: str
    renamed: bool = False


class EventData(_Data):
    """The data of one event type; ``type`` is the envelope's ``type`` for it."""

    type: ClassVar[str]


class TurnStarted(EventData):
    """Always `seq` 1, as soon as the turn is accepted: what runs, on which model and sandbox, within which
    limits. `max_turn_cost_usd` is null without a cost budget; `max_tokens`/`sub_max_tokens` are the caps
    sent with each root / sub-LM and child request. `cell_id` is the notebook cell the turn ran from
    (null outside notebooks); `supersedes_turn_id` the earlier run of that cell it replaces in the history."""

    type: ClassVar[str] = "turn.started"
    task: str
    run_id: str
    model: str | None
    sandbox: str
    limits: TurnLimits
    skills: list[str] = []
    """The skills preselected for the turn (their cards are in its prompt)."""
    attachments: list[TurnFileInfo] = []
    """The turn's files (`attachment_ids`) as placed in `/workspace/files/`; `renamed`: another file held the
    attachment's name, so it got a suffixed one."""
    cell_id: str | None = None
    supersedes_turn_id: str | None = None


class IterationStarted(EventData):
    """Before the model is asked for the next step."""

    type: ClassVar[str] = "iteration.started"
    iteration: int
    max_iters: int


class LMDelta(EventData):
    """Tokens of an LM call as they arrive, for watchers: a piece of the step's `reasoning` or `code` field
    (coalesced: a piece at most every ~50 ms or 256 characters). The pieces of one `call_id` and field,
    joined, are (in the usual case) the text the step's own `reasoning` / `code` event carries; those
    events still carry the whole text, so deltas are never needed to rebuild a turn. `call_id` names one
    attempt of one call: text under a new `call_id` starts afresh. `thinking` (an extension of the two
    fields) is a piece of the provider's own thinking text, which `lm.finished` carries whole as
    `reasoning_content`."""

    type: ClassVar[str] = "lm.delta"
    iteration: int
    call_id: str
    field: Literal["reasoning", "code", "thinking"]
    text: str


class Reasoning(EventData):
    """The model's reasoning for the step."""

    type: ClassVar[str] = "reasoning"
    iteration: int
    text: str


class Code(EventData):
    """The code it wrote, before it runs."""

    type: ClassVar[str] = "code"
    iteration: int
    code: str


class Output(EventData):
    """Chunks of what the code prints, while it runs (coalesced, ≤ ~20/s)."""

    type: ClassVar[str] = "output"
    iteration: int
    stream: Literal["stdout", "stderr"]
    text: str


class ExecutionFinished(EventData):
    """The code finished, failed or timed out; `error` is null unless it failed."""

    type: ClassVar[str] = "execution.finished"
    iteration: int
    duration_ms: float
    error: ErrorInfo | None = None


class LMFinished(EventData):
    """Each LM call (root steps, `llm_query`, child RLMs)."""

    type: ClassVar[str] = "lm.finished"
    role: Literal["root", "sub"]
    model: str | None
    duration_ms: float
    usage: LMUsage
    cost_usd: float | None = None
    finish_reason: str | None = None
    """Why the reply ended, as the provider says: `stop`, `length` (cut at the completion cap, `[lm] max_tokens`
    or `sub_max_tokens`), `tool_calls`, `content_filter`; `not_sent` when the turn failed before the call
    was made (no model configured, say), which the status line and the metrics do not count as a call;
    `stopped` when Fleet closed the call's stream (the turn was stopped, or the call would have passed
    `limits.max_turn_tokens`): its usage is then estimated from what streamed; null when not known."""
    reasoning_content: str | None = None
    """The provider's own thinking text, when it sends one (`reasoning_content`, Anthropic thinking blocks)."""
    reasoning_tokens: int | None = None
    """The tokens of that thinking, when the provider counts them (part of `completion_tokens`)."""


NOT_SENT = "not_sent"


def lm_not_sent(model: str | None) -> LMFinished:
    """The ``lm.finished`` of a turn that failed before its first call: every turn reports its LM step."""
    return LMFinished(role="root", model=model, duration_ms=0.0, usage={}, cost_usd=None, finish_reason=NOT_SENT)


class ToolStarted(EventData):
    """A host tool called from sandbox code (`llm_query`, `llm_query_batched`, `load_skill`,
    `read_skill_resource`, `remember`, `search_memories`, `forget`, the `[[tools]]` and MCP tools of
    fleet.toml; in a `%%fleet` turn `notebook` and the user's own functions) starts."""

    type: ClassVar[str] = "tool.started"
    call_id: str
    name: str
    args_preview: str


class ToolFinished(EventData):
    """That host tool call returned or raised."""

    type: ClassVar[str] = "tool.finished"
    call_id: str
    ok: bool
    result_preview: str
    duration_ms: float


class AgentStarted(EventData):
    """A child `dspy.RLM`, built by model code, starts; its own events carry its `agent_id`."""

    type: ClassVar[str] = "agent.started"
    agent_id: str
    parent_agent_id: str | None
    depth: int
    task: str


class AgentFinished(EventData):
    """That child RLM returned or raised."""

    type: ClassVar[str] = "agent.finished"
    agent_id: str
    ok: bool


class Artifact(EventData):
    """A file new or changed under `/workspace/artifacts/`."""

    type: ClassVar[str] = "artifact"
    artifact_id: str
    path: str
    mime: str
    size: int
    sha256: str


class TurnCompleted(EventData):
    """The turn ended with an answer."""

    type: ClassVar[str] = "turn.completed"
    answer: str
    usage: TurnUsage
    duration_ms: float
    extracted: bool = False
    """True when the model ran out of iterations (or the turn reached its deadline or budget) without calling
    `SUBMIT`, and dspy extracted the answer from the steps so far: a best guess, to be checked."""
    reason: str | None = None
    """Why the answer was extracted: `max_iters`, `deadline` or `budget`; null when the model submitted it."""
    result: Any = None
    """The validated value for the turn's `output_schema`; null without one."""


class TurnFailed(EventData):
    """The turn failed. The message says what to set or check; it never contains a credential."""

    type: ClassVar[str] = "turn.failed"
    error: ErrorInfo
    """`type` `budget_exceeded`: the turn used up `limits.max_turn_tokens` or `max_turn_cost_usd` (the message
    says which, and how much was used); `deadline_exceeded`: it ran past `limits.turn_timeout_s` (either only
    when no step had finished or no answer could be extracted from them, else `turn.completed`, `extracted`);
    `too_many_errors`: its code failed `limits.max_errors` steps in a row (the message quotes the last error);
    `interrupted`: the process running it died and the next runner on the store closed it; `disk_full`: files the
    sandbox wrote could not be saved to the workspace, or an artifact to the store, because the disk is full (the
    message names the path, its mount point and the files lost); `workspace_unsaved`: files could not be saved for
    another reason (the message says which and why)."""


class TurnCancelledData(EventData):
    """Interrupt, Stop button, `PUT /api/runs/{run_id}/cancellation`; when several come, the first one's reason."""

    type: ClassVar[str] = "turn.cancelled"
    reason: str


EVENT_CLASSES: tuple[type[EventData], ...] = (
    TurnStarted, IterationStarted, LMDelta, Reasoning, Code, Output, ExecutionFinished, LMFinished,
    ToolStarted, ToolFinished, AgentStarted, AgentFinished, Artifact,
    TurnCompleted, TurnFailed, TurnCancelledData,
)  # fmt: skip
"""Every event type, in the order of a turn (the docs table's order)."""
EVENT_TYPES: dict[str, type[EventData]] = {cls.type: cls for cls in EVENT_CLASSES}
TERMINAL_CLASSES: tuple[type[EventData], ...] = (TurnCompleted, TurnFailed, TurnCancelledData)
TERMINAL_TYPES = frozenset(cls.type for cls in TERMINAL_CLASSES)
if TYPE_CHECKING:
    EventType = str  # the checker cannot read a Literal built at run time
else:
    EventType = Literal[tuple(EVENT_TYPES)]

ROOT_AGENT = "root"


class Event(BaseModel):
    """The envelope, exactly as stored, streamed and rendered."""

    model_config = ConfigDict(frozen=True)

    v: int = ENVELOPE_VERSION
    seq: int
    type: EventType
    session_id: str
    turn_id: str
    agent_id: str = ROOT_AGENT
    parent_agent_id: str | None = None
    ts: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES

    @property
    def payload(self) -> EventData:
        """``data`` as its type's class (an ``Output``, a ``TurnCompleted``…)."""
        return EVENT_TYPES[self.type].model_validate(self.data)

    def to_json(self) -> str:
        return self.model_dump_json()


_this_second: tuple[int, str] = (-1, "")  # the current second as text: six events a step share it


def utc_timestamp(moment: datetime | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``, as in the contract."""
    global _this_second
    if moment is not None:
        return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
    now = time.time()
    second, text = _this_second
    if int(now) != second:
        second = int(now)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _this_second = (second, text)
    return f"{text}.{int((now - second) * 1000):03d}Z"


def data_of(type_: str, fields: dict[str, Any]) -> EventData:
    """Recorded (wire) data as its type's class.

    Raises:
        KeyError: unknown event type (a programming error).
        pydantic.ValidationError: a field is missing, unknown or of the wrong type.
    """
    return EVENT_TYPES[type_].model_validate(fields)


def make_event(
    data: EventData | str,
    fields: dict[str, Any] | None = None,
    *,
    seq: int,
    session_id: str,
    turn_id: str,
    agent_id: str = ROOT_AGENT,
    parent_agent_id: str | None = None,
    ts: str | None = None,
) -> Event:
    """The envelope of ``data`` (an event class instance, or a type name and its recorded fields)."""
    if isinstance(data, str):
        data = data_of(data, fields or {})
    canonical = data.model_dump(mode="json")  # validated when built and on each assignment
    return Event(
        seq=seq,
        type=data.type,
        session_id=session_id,
        turn_id=turn_id,
        agent_id=agent_id,
        parent_agent_id=parent_agent_id,
        ts=ts or utc_timestamp(),
        data=terminal_safe_data(canonical),
    )


def parse_event(envelope: str | bytes | dict[str, Any]) -> tuple[Event, EventData]:
    """An envelope (JSON text or a decoded dict, as stored or streamed) and its typed data.

    Raises:
        pydantic.ValidationError: not an envelope of a known type, or its data does not fit the type.
    """
    event = Event.model_validate_json(envelope) if isinstance(envelope, str | bytes) else Event.model_validate(envelope)
    return event, event.payload


def is_terminal(event: Event | dict[str, Any]) -> bool:
    """Whether an event (an envelope or its decoded JSON) ends its turn."""
    return (event.type if isinstance(event, Event) else event.get("type")) in TERMINAL_TYPES


# ---------------------------------------------------------------------------------------------- docs


def _shape(annotation: Any) -> str:
    """A field's type as the docs table writes it: nested fields in braces, literals as ``a|b``."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return ": " + "\\|".join(str(a) for a in get_args(annotation))
    if len(args) == 1:
        return _shape(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{" + ", ".join(annotation.model_fields) + "}"
    return ""


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def event_table() -> str:
    """The Markdown table of docs/events.md, from the classes: fields, then docstrings and field docs."""
    rows = ["| type | data | when |", "|---|---|---|"]
    for cls in EVENT_CLASSES:
        fields = ", ".join(f"{name}{_shape(info.annotation)}" for name, info in cls.model_fields.items())
        notes = [_one_line(cls.__doc__)]
        for name, info in cls.model_fields.items():
            if info.description:
                notes.append(f"`{name}`: {_one_line(info.description)}")
        rows.append(f"| `{cls.type}` | `{fields}` | {' '.join(notes)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(event_table(), end="")
