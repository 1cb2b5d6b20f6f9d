"""Request and response bodies of the public contract (DESIGN.md Part 2).

Requests forbid unknown fields, so a typo is a 422 rather than a silently ignored option. Responses
extend the contract's shapes and never rename their fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleet_kernel.engine.choices import MAX_ATTACHMENTS
from fleet_kernel.engine.prepare import MAX_TASK_CHARS
from fleet_kernel.skills import MAX_PRESELECTED

TurnStatus = Literal["running", "completed", "failed", "cancelled", "interrupted"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        """PostgreSQL's text and jsonb cannot hold U+0000 (SQLite can): refused here, the same on every store."""
        if _has_nul(data):
            raise ValueError("a string in the body contains a NUL character (U+0000); remove it and send again")
        return data


def _has_nul(value: Any) -> bool:
    """Whether any string in a JSON value holds U+0000 (a loop, not recursion: bodies may nest deeply)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
    return False


def _example(summary: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "value": value}


# Request body examples for the interactive docs: "Try it out" sends the first one as it stands, so each
# is a request this API accepts on a fresh session (no skill, attachment or turn id it would not know).
SESSION_CREATE_EXAMPLES = {"titled": _example("A session with a title", {"title": "Sales by region"})}
SESSION_UPDATE_EXAMPLES = {
    "rename": _example("Rename the session", {"title": "Sales by region, 2026"}),
    "archive": _example("Archive it", {"archived": True}),
}
FEEDBACK_EXAMPLES = {
    "good": _example("Mark the answer good", {"rating": "good", "note": "right, and it showed its working"}),
    "bad": _example("Mark the answer bad", {"rating": "bad", "note": "it summed the wrong column"}),
}
EVAL_EXAMPLES = {
    "one": _example(
        "One task on the configured model",
        {"tasks": [{"id": "product", "task": "What is 6 times 7?", "expected": 42, "scorer": "numeric"}]},
    ),
}
TURN_CREATE_EXAMPLES = {
    "task": _example("A task", {"task": "What is 6 times 7? Compute it in Python."}),
    "limits": _example(
        "A task with lower limits for this turn",
        {"task": "Count the words in 'the quick brown fox'.", "limits": {"max_iters": 4, "timeout_s": 120}},
    ),
    "result": _example(
        "A task whose answer is a typed result",
        {
            "task": "Add 19.5 and 22.5.",
            "output_schema": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]},
        },
    ),
}
TURN_UPDATE_EXAMPLES = {"forget": _example("Take the turn out of the history", {"in_history": False})}
MEMORY_PUT_EXAMPLES = {
    "note": _example("A note for later turns", {"content": "The sales figures are in euros.", "kind": "fact"})
}


class SessionCreate(_Request):
    title: str = Field("", max_length=200, description="shown in lists; defaults to the first task")


class SessionUpdate(_Request):
    title: str | None = Field(None, max_length=200)
    archived: bool | None = Field(
        None, description="archived sessions are left out of GET /api/sessions unless asked for"
    )
    model: str | None = Field(None, max_length=200, description="this session's root LM; null for FLEET_LM_MODEL")
    sub_model: str | None = Field(None, max_length=200, description="its sub-LM; null for FLEET_SUB_LM_MODEL")


class TurnLimitsRequest(_Request):
    """Lower limits for this turn; each at most the configured policy (``[limits]`` in fleet.toml)."""

    max_iters: int | None = Field(None, ge=1, description="RLM iterations")
    max_llm_calls: int | None = Field(None, ge=0, description="sub-LM calls (llm_query*)")
    timeout_s: float | None = Field(None, gt=0, description="deadline for the whole turn (limits.turn_timeout_s)")
    max_turn_tokens: int | None = Field(None, ge=1, description="prompt plus completion tokens over all LM calls")
    max_turn_cost_usd: float | None = Field(None, gt=0, description="LM cost of the turn")
    max_errors: int | None = Field(None, ge=1, description="steps in a row whose code may fail (limits.max_errors)")

    def policy_names(self) -> dict[str, Any]:
        """The given limits under their ``[limits]`` names."""
        given = self.model_dump(exclude_none=True)
        if "timeout_s" in given:
            given["turn_timeout_s"] = given.pop("timeout_s")
        return given


class TurnCreate(_Request):
    task: str = Field(..., min_length=1, max_length=MAX_TASK_CHARS, description="what the model should do")
    skills: list[str] = Field(
        [], max_length=MAX_PRESELECTED, description="skills whose cards go into this turn's prompt (GET /api/skills)"
    )
    attachment_ids: list[str] = Field(
        [],
        max_length=MAX_ATTACHMENTS,
        description="attachments of this session, put in /workspace/files/ and named to the model as the turn's files",
    )
    output_schema: dict[str, Any] | None = Field(
        None,
        description=(
            "a JSON Schema object of plain types; the model must submit a `result` that satisfies it. A "
            'property {"type": "string", "format": "artifact"} takes the path of a file the turn saved under '
            "artifacts/; the result carries a reference to that artifact in its place"
        ),
        json_schema_extra={
            "example": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}
        },
    )
    limits: TurnLimitsRequest | None = None
    tools: list[str] | None = Field(
        None,
        max_length=100,
        description="the host tools sandbox code may call in this turn (GET /api/tools); default: all configured",
    )
    supersedes_turn_id: str | None = Field(
        None,
        max_length=64,
        description="a turn of this session that this one replaces in the history later turns see (a cell run again)",
    )


class TurnUpdate(_Request):
    in_history: bool = Field(
        ..., description="false: later turns no longer see this turn (recorded, reversible); true: they see it again"
    )


class ErrorDetail(BaseModel):
    code: str = Field(..., description="stable, machine-readable: not_found, session_busy, validation_error, ...")
    message: str = Field(..., description="what went wrong and what to do next")
    turn_id: str | None = Field(None, description="409 session_busy: the turn that is running")


class ErrorBody(BaseModel):
    error: ErrorDetail


class Session(BaseModel):
    session_id: str
    title: str
    created_at: str
    updated_at: str
    turn_count: int
    archived: bool
    model: str | None = Field(None, description="the session's own root LM, when it chose one")
    sub_model: str | None = Field(None, description="the session's own sub-LM, when it chose one")


class SessionList(BaseModel):
    sessions: list[Session]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page; null on the last")


class SessionConfig(BaseModel):
    """The effective settings of a turn of the session, without any secret."""

    session_id: str
    model: str | None
    sub_model: str | None
    model_source: Literal["session", "settings"]
    sub_model_source: Literal["session", "settings", "model"]
    sandbox: str
    limits: dict[str, Any]
    history: dict[str, int]
    memory: dict[str, int]
    skills: list[str]


class Memory(BaseModel):
    memory_id: str
    content: str
    kind: str
    created_at: str
    updated_at: str


class MemoryList(BaseModel):
    memories: list[Memory]


class MemoryPut(_Request):
    content: str = Field(..., min_length=1, description="the text; at most memory.max_chars")
    kind: str = Field("note", max_length=32, description="a short lowercase word: note, fact, preference, ...")


class WorkspaceStat(BaseModel):
    path: str = Field(..., description="relative to /workspace")
    size: int
    sha256: str
    modified_at: str


class Turn(BaseModel):
    turn_id: str
    run_id: str
    session_id: str
    task: str
    status: TurnStatus
    answer: str | None
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    result: Any = Field(
        None,
        description="the validated value for the turn's output_schema (artifact paths replaced by artifact "
        "references); null without one",
    )
    started_at: str
    finished_at: str | None
    extracted: bool = Field(
        False,
        description="true when the answer was not submitted by the model but extracted by dspy from the steps "
        "so far, after the turn reached a limit: a best guess, to be checked",
    )
    extraction_reason: Literal["max_iters", "deadline", "budget"] | None = Field(
        None, description="the limit the turn reached when its answer was extracted; null when it was submitted"
    )
    position: int = Field(..., description="1 for the session's first turn")
    last_seq: int = Field(..., description="seq of the last committed event")
    model: str | None
    sandbox: str | None
    cancel_requested: bool
    cell_id: str | None = Field(None, description="the notebook cell the turn ran from; null outside notebooks")
    supersedes_turn_id: str | None = Field(None, description="the earlier turn of its cell that this one replaces")
    superseded_by: str | None = Field(None, description="the later turn that replaces this one, if any")
    in_history: bool = Field(
        False, description="whether the next turn sees this one (its cell's latest completed turn, not forgotten)"
    )


class TurnList(BaseModel):
    turns: list[Turn]


class HistorySummary(BaseModel):
    """The session's rolling summary of its turns past the history window, written by the sub-model."""

    text: str
    turn_ids: list[str] = Field(..., description="the turns it covers, oldest first")
    model: str | None = Field(None, description="the sub-model that wrote it")
    updated_at: str
    stale: bool = Field(
        False,
        description="true when a turn it covers was since re-run or forgotten: the next turn rebuilds it and "
        "does not use this text",
    )


class HistoryWindow(BaseModel):
    turns: int = Field(..., description="[history] window_turns: at most this many latest turns are given whole")
    chars: int = Field(..., description="the history's characters: [history] max_chars, less for a small context")
    context_tokens: int | None = Field(None, description="the root model's context length, when known")


class SessionHistory(BaseModel):
    """What the session's next turn sees of its earlier turns."""

    session_id: str
    seen: int = Field(..., description="how many earlier turns the next turn sees, summarised or whole")
    summarised: int = Field(..., description="how many of them, the oldest, are past the window")
    pending: int = Field(
        ..., description="how many of those the summary does not cover yet: the next turn folds them in first"
    )
    summary: HistorySummary | None = Field(None, description="null until a session outgrows its window")
    turns: list[Turn] = Field(..., description="the latest turns, given whole, oldest first")
    window: HistoryWindow


class TurnAccepted(BaseModel):
    turn_id: str
    run_id: str
    session_id: str
    status: TurnStatus
    created: bool = Field(..., description="false when the Idempotency-Key named an existing turn")


class Cancellation(BaseModel):
    run_id: str
    state: Literal["requested", "already_requested", "already_terminal"]
    turn_id: str


class Attachment(BaseModel):
    attachment_id: str
    session_id: str | None
    filename: str = Field(..., description="the name the client uploaded")
    path: str = Field(..., description="where the sandbox sees it, relative to /workspace (files/...)")
    mime: str
    size: int
    sha256: str
    created_at: str


class Artifact(BaseModel):
    artifact_id: str
    session_id: str
    turn_id: str
    path: str = Field(..., description="relative to /workspace (artifacts/...)")
    mime: str
    size: int
    sha256: str
    created_at: str


class VolumeEntry(BaseModel):
    path: str = Field(..., description="relative to the workspace root")
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    depth: int = Field(..., description="1 for entries directly under the listed folder")
    size: int | None = Field(None, description="bytes, for files")
    mime: str | None = None
    modified_at: str | None = None


class VolumeTree(BaseModel):
    session_id: str
    path: str
    max_depth: int
    entries: list[VolumeEntry]
    truncated: bool = Field(..., description="true when the entry limit cut the listing short")


class Skill(BaseModel):
    name: str
    description: str
    source: Literal["bundled", "home", "project"] = Field(
        ..., description="bundled with Fleet, $FLEET_HOME/skills, or ./.fleet/skills of the server's directory"
    )
    resources: list[str] = Field(..., description="the card's other files, for read_skill_resource(name, path)")
    body: str


class HostToolInfo(BaseModel):
    name: str = Field(..., description="what sandbox code calls; MCP tools are <server>__<tool>")
    signature: str
    docstring: str
    source: str = Field(..., description='"fleet.toml" ([[tools]]) or "mcp:<server>" ([[mcp.servers]])')


class ToolList(BaseModel):
    tools: list[HostToolInfo]
    warnings: list[str] = Field(..., description="MCP servers that could not start, and why (their tools are missing)")


class SkillList(BaseModel):
    skills: list[Skill]
    warnings: list[str] = Field(
        ...,
        description="cards skipped (malformed, unreadable) or not used (an untrusted project folder, a name a "
        "bundled or home card already has), and home cards replacing bundled ones",
    )


class ComponentHealth(BaseModel):
    ok: bool
    detail: str


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    version: str
    store: ComponentHealth
    sandbox: ComponentHealth


class FeedbackCreate(_Request):
    rating: Literal["good", "bad"] = Field(..., description="what the user thinks of the turn's answer")
    note: str = Field("", max_length=4000, description="why, in the user's words")


class Feedback(BaseModel):
    turn_id: str
    session_id: str
    rating: Literal["good", "bad"]
    note: str
    created_at: str
    updated_at: str = Field(..., description="when it was last marked (a new mark replaces the earlier one)")


class FeedbackDataset(BaseModel):
    tasks: list[dict[str, Any]] = Field(
        ...,
        description="one data set row per turn marked good, oldest first: "
        '{"id": turn id, "task", "expected": its answer, "scorer": "exact"} (docs/eval.md); '
        "the body of POST /api/evals takes them as they are, and a .jsonl data set is one a line",
    )


class EvalCreate(_Request):
    tasks: list[dict[str, Any]] = Field(
        ..., min_length=1, max_length=200, description="data set rows (docs/eval.md), without attachments"
    )
    models: list[str] = Field(
        [], max_length=8, description="models to run every task on; none: the configured one (FLEET_LM_MODEL)"
    )
    repeat: int = Field(1, ge=1, le=100, description="runs of each task on each model")
    concurrency: int = Field(1, ge=1, le=32, description="runs at once")
    judge: str | None = Field(None, max_length=200, description="the model that grades rubric tasks")
    name: str = Field(
        "api", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="names the runs' sessions and the report"
    )


class EvalRun(BaseModel):
    task_id: str
    model: str
    repeat: int
    session_id: str = Field(..., description="the run's own session, open and exportable like any other")
    turn_id: str
    status: str
    answer: str | None
    score: float = Field(..., description="0 to 1; the run passes at 1")
    reason: str
    iterations: int
    tokens: int
    cost_usd: float
    duration_s: float
    error: dict[str, Any] | None


class EvalSummary(BaseModel):
    model: str
    mean: float
    spread: float = Field(..., description="standard deviation of the per-repeat mean scores")
    passed: int
    runs: int
    iterations: float
    tokens: int
    cost_usd: float
    duration_s: float


class EvalResult(BaseModel):
    name: str
    models: list[str]
    tasks: list[str]
    repeat: int
    summary: list[EvalSummary]
    results: list[EvalRun]
