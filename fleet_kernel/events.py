"""The event vocabulary: every step of a turn as one typed, versioned envelope.

Defined once here and imported by the engine (emits), the store (keeps), the API (streams over SSE),
the kernel (renders) and the notebook export (transcribes). ``make_event`` validates ``data`` against
the type's model, so an unknown type or a missing field fails loudly instead of travelling as a dict,
and makes its text ``terminal_safe``: events carry what sandboxed code printed and what the model wrote
to terminals and ``text/plain`` outputs, where control sequences would act on the user's terminal.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from fleet_kernel.textsafe import terminal_safe_data

ENVELOPE_VERSION = 1


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class LMUsage(_Data):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TurnUsage(_Data):
    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class TurnFileInfo(_Data):
    """An attachment in ``/workspace/files/`` for this turn; ``renamed`` when it was placed under a
    suffixed name because another file held its own."""

    attachment_id: str
    name: str
    path: str
    size: int
    sha256: str
    renamed: bool = False


class TurnStarted(_Data):
    """Always ``seq`` 1: what runs, on which model and sandbox, within which limits."""

    task: str
    run_id: str
    model: str | None
    sandbox: str
    limits: TurnLimits
    skills: list[str] = []
    """Skills preselected for the turn (their cards are in its prompt)."""
    attachments: list[TurnFileInfo] = []
    """The turn's files (``attachment_ids``), as placed in ``/workspace/files/``."""


class IterationStarted(_Data):
    iteration: int
    max_iters: int


class Reasoning(_Data):
    iteration: int
    text: str


class Code(_Data):
    iteration: int
    code: str


class Output(_Data):
    """A chunk of what the code printed, sent while it runs."""

    iteration: int
    stream: Literal["stdout", "stderr"]
    text: str


class ExecutionFinished(_Data):
    iteration: int
    duration_ms: float
    error: ErrorInfo | None = None


class LMFinished(_Data):
    role: Literal["root", "sub"]
    model: str | None
    duration_ms: float
    usage: LMUsage
    cost_usd: float | None = None


class ToolStarted(_Data):
    call_id: str
    name: str
    args_preview: str


class ToolFinished(_Data):
    call_id: str
    ok: bool
    result_preview: str
    duration_ms: float


class AgentStarted(_Data):
    """A child RLM, built by model-written code, starts; its own events carry its ``agent_id``."""

    agent_id: str
    parent_agent_id: str | None
    depth: int
    task: str


class AgentFinished(_Data):
    agent_id: str
    ok: bool


class Artifact(_Data):
    artifact_id: str
    path: str
    mime: str
    size: int
    sha256: str


class TurnCompleted(_Data):
    answer: str
    usage: TurnUsage
    duration_ms: float
    extracted: bool = False
    """True when the model ran out of iterations and the answer was extracted, not submitted."""
    result: Any = None
    """The value the model submitted for the turn's ``output_schema``, validated; null without one."""


class TurnFailed(_Data):
    error: ErrorInfo


class TurnCancelledData(_Data):
    reason: str


EVENT_TYPES: dict[str, type[_Data]] = {
    "turn.started": TurnStarted,
    "iteration.started": IterationStarted,
    "reasoning": Reasoning,
    "code": Code,
    "output": Output,
    "execution.finished": ExecutionFinished,
    "lm.finished": LMFinished,
    "tool.started": ToolStarted,
    "tool.finished": ToolFinished,
    "agent.started": AgentStarted,
    "agent.finished": AgentFinished,
    "artifact": Artifact,
    "turn.completed": TurnCompleted,
    "turn.failed": TurnFailed,
    "turn.cancelled": TurnCancelledData,
}
TERMINAL_TYPES = frozenset({"turn.completed", "turn.failed", "turn.cancelled"})
EventType = Literal[
    "turn.started", "iteration.started", "reasoning", "code", "output", "execution.finished", "lm.finished",
    "tool.started", "tool.finished", "agent.started", "agent.finished", "artifact",
    "turn.completed", "turn.failed", "turn.cancelled",
]  # fmt: skip

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

    def to_json(self) -> str:
        return self.model_dump_json()


def utc_timestamp(moment: datetime | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``, as in the contract."""
    moment = moment or datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def validate_data(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    """Check ``data`` against its type's model; return it in canonical JSON form.

    Raises:
        KeyError: unknown event type (a programming error).
        pydantic.ValidationError: a field is missing or of the wrong type.
    """
    model = EVENT_TYPES[type_]
    return model.model_validate(data).model_dump(mode="json")


def make_event(
    type_: str,
    data: dict[str, Any],
    *,
    seq: int,
    session_id: str,
    turn_id: str,
    agent_id: str = ROOT_AGENT,
    parent_agent_id: str | None = None,
    ts: str | None = None,
) -> Event:
    return Event(
        seq=seq,
        type=type_,  # type: ignore[arg-type]
        session_id=session_id,
        turn_id=turn_id,
        agent_id=agent_id,
        parent_agent_id=parent_agent_id,
        ts=ts or utc_timestamp(),
        data=terminal_safe_data(validate_data(type_, data)),
    )
