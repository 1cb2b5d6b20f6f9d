"""The one fold of a turn's typed events into what every renderer shows.

``TurnView.apply`` takes events in ``seq`` order, live or stored, and keeps iterations (reasoning, code,
output, execution result, tool calls), child agents, artifacts, LM usage and the outcome. The kernel's
widget, its console text and plain displays, and the transcript (Markdown, HTML, text, notebooks) all
read this view; none of them looks at an event's type. A new event type is added in ``events.py``,
here, and in the renderer that shows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet_kernel.events import (
    NOT_SENT,
    ROOT_AGENT,
    AgentFinished,
    AgentStarted,
    Artifact,
    Code,
    Event,
    ExecutionFinished,
    IterationStarted,
    LMDelta,
    LMFinished,
    Output,
    Reasoning,
    ToolFinished,
    ToolStarted,
    TurnCancelledData,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)

if TYPE_CHECKING:
    from fleet_kernel.store import TurnRow

KEEP_OUTPUT_CHARS = 200_000
"""Output kept per iteration in memory (what live views can show); the store keeps all of it."""


EXTRACTION_LIMITS = {
    "max_iters": "its iteration limit (limits.max_iters)",
    "deadline": "its deadline (limits.turn_timeout_s)",
    "budget": "its token or cost budget (limits.max_turn_tokens, max_turn_cost_usd)",
}
"""The limit named when an answer was extracted, by ``turn.completed``'s ``reason``."""


@dataclass
class IterationView:
    """One RLM iteration of one agent: what the model thought, wrote, and what the code printed."""

    agent_id: str
    iteration: int
    max_iters: int
    reasoning: str = ""
    code: str = ""
    output: str = ""
    chunks: list[tuple[str, str]] = field(default_factory=list)
    """The kept output as it arrived, ``(stream, text)``: live views stream it, stderr apart."""
    output_dropped: int = 0
    duration_ms: float | None = None
    error: dict[str, str] | None = None
    tools: list[str] = field(default_factory=list)
    finished: bool = False
    live_call: str = ""
    """The LM call whose tokens ``live_reasoning`` and ``live_code`` hold (``lm.delta``), until the step's
    own ``reasoning`` and ``code`` replace them. Live views show them; transcripts never do."""
    live_reasoning: str = ""
    live_code: str = ""
    live_thinking: str = ""
    """The provider's thinking as it streams (``lm.delta`` field ``thinking``), until ``lm.finished`` keeps it
    in ``thinking``."""
    thinking: list[str] = field(default_factory=list)
    """The provider's own thinking text of each LM call made for this iteration (``lm.finished``)."""

    @property
    def shown_reasoning(self) -> str:
        """The reasoning as a live view shows it: the step's, else what has streamed of it."""
        return self.reasoning or self.live_reasoning

    @property
    def shown_code(self) -> str:
        return self.code or self.live_code

    @property
    def label(self) -> str:
        who = "" if self.agent_id == ROOT_AGENT else f"{self.agent_id} · "
        return f"{who}iteration {self.iteration}/{self.max_iters}"

    def add_output(self, stream: str, text: str) -> None:
        room = max(KEEP_OUTPUT_CHARS - len(self.output), 0)
        kept = text[:room]
        self.output += kept
        if kept:
            self.chunks.append((stream, kept))
        self.output_dropped += len(text) - len(kept)


@dataclass
class AgentView:
    """A child RLM started by model code."""

    agent_id: str
    parent_agent_id: str | None
    depth: int
    task: str
    ok: bool | None = None


@dataclass
class TurnView:
    """Everything a renderer needs about one turn, folded from its events in ``seq`` order."""

    session_id: str = ""
    turn_id: str = ""
    started: bool = False
    task: str = ""
    model: str | None = None
    sandbox: str = ""
    max_iters: int = 0
    iterations: list[IterationView] = field(default_factory=list)
    lm_calls: int = 0
    sub_lm_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    agents: dict[str, AgentView] = field(default_factory=dict)
    status: str = "running"
    answer: str = ""
    error: dict[str, str] | None = None
    reason: str = ""
    duration_ms: float | None = None
    extracted: bool = False
    extraction_reason: str | None = None  # max_iters | deadline | budget

    @classmethod
    def of(cls, events: Iterable[Event], turn: TurnRow | None = None) -> TurnView:
        view = cls()
        for event in events:
            view.apply(event)
        if turn is not None:
            view.adopt_row(turn)
        return view

    def adopt_row(self, turn: TurnRow) -> None:
        """Fill what the events did not say (a turn reaped before its terminal event, say)."""
        self.session_id, self.turn_id = turn.session_id, turn.turn_id
        self.task = self.task or turn.task
        self.model = self.model or turn.model
        if self.status == "running" and turn.status != "running":
            self.status = turn.status
            self.answer = turn.answer or ""
            self.error = turn.error
            self.extraction_reason = turn.extraction_reason
            self.extracted = turn.extraction_reason is not None

    @property
    def current(self) -> IterationView | None:
        return self.iterations[-1] if self.iterations else None

    @property
    def done(self) -> bool:
        return self.status != "running"

    def _iteration(self, agent_id: str, number: int) -> IterationView:
        for it in reversed(self.iterations):
            if it.agent_id == agent_id and it.iteration == number:
                return it
        it = IterationView(agent_id, number, self.max_iters)
        self.iterations.append(it)
        return it

    def _latest(self, agent_id: str) -> IterationView | None:
        return next((it for it in reversed(self.iterations) if it.agent_id == agent_id), self.current)

    def apply(self, event: Event) -> IterationView | None:  # noqa: C901 - a dispatch table, one case per event type
        """Fold one event in; returns the iteration it touched, if any."""
        self.session_id, self.turn_id = event.session_id, event.turn_id
        agent = event.agent_id
        match event.payload:
            case TurnStarted() as d:
                self.started = True
                self.task, self.model, self.sandbox, self.max_iters = d.task, d.model, d.sandbox, d.limits.max_iters
            case IterationStarted() as d:
                for it in self.iterations:
                    it.finished = True
                it = self._iteration(agent, d.iteration)
                it.max_iters = d.max_iters
                return it
            case LMDelta() as d:
                it = self._iteration(agent, d.iteration)
                if it.live_call != d.call_id:  # another call (or a retried attempt): its text starts afresh
                    it.live_call, it.live_reasoning, it.live_code, it.live_thinking = d.call_id, "", "", ""
                if d.field == "reasoning":
                    it.live_reasoning += d.text
                elif d.field == "thinking":
                    it.live_thinking += d.text
                else:
                    it.live_code += d.text
                return it
            case Reasoning() as d:
                it = self._iteration(agent, d.iteration)
                it.reasoning, it.live_reasoning = d.text, ""
                return it
            case Code() as d:
                it = self._iteration(agent, d.iteration)
                it.code, it.live_code = d.code, ""
                return it
            case Output() as d:
                it = self._iteration(agent, d.iteration)
                it.add_output(d.stream, d.text)
                return it
            case ExecutionFinished() as d:
                it = self._iteration(agent, d.iteration)
                it.duration_ms, it.error = d.duration_ms, d.error.model_dump() if d.error else None
                return it
            case LMFinished() as d if d.finish_reason != NOT_SENT:
                if d.reasoning_content:
                    latest = self._latest(agent)
                    if latest is not None:
                        latest.thinking.append(d.reasoning_content)
                        latest.live_thinking = ""
                self.lm_calls += 1
                self.sub_lm_calls += d.role == "sub"
                self.tokens += d.usage.prompt_tokens + d.usage.completion_tokens
                self.cost_usd += d.cost_usd or 0.0
            case ToolStarted() as d:
                latest = self._latest(agent)
                if latest is not None:
                    latest.tools.append(f"{d.name}({d.args_preview})")
                return latest
            case ToolFinished():
                pass
            case AgentStarted() as d:
                self.agents[d.agent_id] = AgentView(d.agent_id, d.parent_agent_id, d.depth, d.task)
            case AgentFinished() as d:
                if d.agent_id in self.agents:
                    self.agents[d.agent_id].ok = d.ok
            case Artifact() as d:
                self.artifacts.append(d.model_dump())
            case TurnCompleted() as d:
                self._finish("completed")
                self.answer, self.duration_ms, self.extracted = d.answer, d.duration_ms, d.extracted
                self.extraction_reason = d.reason if d.extracted else None
                self.lm_calls = max(self.lm_calls, d.usage.lm_calls)
                self.cost_usd = max(self.cost_usd, d.usage.cost_usd)
            case TurnFailed() as d:
                self._finish("failed")
                self.error = d.error.model_dump()
            case TurnCancelledData() as d:
                self._finish("cancelled")
                self.reason = d.reason
        return None

    def _finish(self, status: str) -> None:
        for it in self.iterations:
            it.finished = True
        self.status = status

    def summary(self) -> str:
        """One line: status, iterations, LM calls, tokens, cost, duration."""
        done = sum(1 for it in self.iterations if it.agent_id == ROOT_AGENT)
        parts = [self.status, f"{done} iteration{'s' * (done != 1)}", f"{self.lm_calls} LM calls"]
        if self.sub_lm_calls:
            parts[-1] += f" ({self.sub_lm_calls} sub)"
        parts += [f"{self.tokens:,} tokens", f"${self.cost_usd:.4f}"]
        if self.duration_ms is not None:
            parts.append(f"{self.duration_ms / 1000:.1f} s")
        return " · ".join(parts)

    def extraction_note(self) -> str:
        """For an answer dspy extracted after a limit (not one the model submitted): which limit, plainly."""
        if self.status != "completed" or not self.extracted:
            return ""
        limit = EXTRACTION_LIMITS.get(self.extraction_reason or "max_iters", EXTRACTION_LIMITS["max_iters"])
        if self.extraction_reason in (None, "max_iters") and self.max_iters:
            limit = f"its iteration limit ({self.max_iters}, limits.max_iters)"
        return (
            f"Extracted answer: the turn reached {limit} before the model called SUBMIT, so this answer was "
            "extracted from the steps so far. It is a best guess: check it."
        )

    def outcome_text(self) -> str:
        if self.status == "cancelled":
            return f"The turn was cancelled: {self.reason or 'cancelled'}."
        if self.error:
            return f"The turn failed: {self.error.get('message', '')} ({self.error.get('type', 'error')})"
        return ""
