"""A turn's ``TurnView`` as plain text, the one text renderer: whole (``render_text``, the transcript's
``text/plain``) or as it grows (``TextStream``, what a terminal prints while the turn runs: ``jupyter
console``, ``%fleet output text``), with the lines both share.

A terminal cannot update what it printed, so ``TextStream`` says each thing once, as it arrives, and
completes a field whose tokens streamed in with the step's own text; the transcript says the finished
turn at once. Model-written text is made terminal-safe where it enters the view (events) or the bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet_kernel.events import ROOT_AGENT
from fleet_kernel.render import clip, error_line, fence, iteration_note, turn_header
from fleet_kernel.view import IterationView, TurnView


def indent(text: str) -> str:
    """Each line of ``text`` indented by four spaces (its trailing newlines dropped)."""
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines())


def indent_more(text: str) -> str:
    """A piece of code printed after an indented line's start: each new line indented too."""
    return text.replace("\n", "\n    ")


def agent_prefix(agent_id: str) -> str:
    """``[agent] `` before what a child RLM says; nothing for the root's."""
    return "" if agent_id == ROOT_AGENT else f"[{agent_id}] "


def artifact_line(art: dict[str, Any], prefix: str, *, mime: bool = True) -> str:
    kind = f"{art['mime']}, " if mime else ""
    return f"{prefix}{art['path']} ({kind}{art['size']:,} bytes)"


# ---------------------------------------------------------------------------------------------- whole


def render_text(view: TurnView) -> str:
    """The finished turn as text: each iteration's reasoning, code, output and error, then the answer."""
    lines = [f"── {turn_header(view)}"]
    for it in view.iterations:
        lines.append(f"── {it.label} " + "─" * 20)
        if it.reasoning:
            lines += ["reasoning:", indent(it.reasoning)]
        if it.code:
            lines += ["code:", indent(fence(it.code, "python"))]
        if it.output or it.output_dropped:
            lines += ["output:", indent(clip(it.output, dropped=it.output_dropped))]
        if it.error:
            lines.append(f"error: {error_line(it.error)}")
    lines += [artifact_line(art, "artifact: ") for art in view.artifacts]
    if view.status == "completed":
        lines += ["── answer " + "─" * 20]
        lines += [view.extraction_note()] if view.extraction_note() else []
        lines.append(view.answer or "(empty answer)")
    elif view.outcome_text():
        lines += ["── " + view.outcome_text()]
    return "\n".join(lines).rstrip() + "\n"


def outcome_text(view: TurnView) -> str:
    """What a terminal shows as the turn's result once ``TextStream`` printed the rest: the answer (after
    how it was extracted, if it was), or how the turn ended."""
    outcome = view.answer if view.status == "completed" else view.outcome_text()
    if view.extraction_note():
        outcome = f"{view.extraction_note()}\n{outcome}"
    return f"{outcome}\n"


def iteration_head_text(it: IterationView) -> str:
    """An iteration's label and what the model has written of it so far (a plain display's ``text/plain``)."""
    return (
        f"── {it.label}{iteration_note(it)}\n"
        + (f"{it.shown_reasoning}\n" if it.shown_reasoning else "")
        + (fence(it.shown_code, "python") if it.shown_code else "")
    )


# ---------------------------------------------------------------------------------------------- growing


@dataclass
class _Growing:
    """A field a text view prints as its tokens stream in, then completes with the step's own text."""

    printed: str = ""  # the field's text printed so far (before indentation)
    open: bool = False  # its last line is still being printed
    done: bool = False


@dataclass
class _Said:
    """How much of one iteration a text view has printed."""

    header: bool = False
    thinking: str = ""  # "open": the provider's thinking streams (its line shows only that), "done"
    reasoning: _Growing = field(default_factory=_Growing)
    code: _Growing = field(default_factory=_Growing)
    chunks: int = 0
    dropped: bool = False
    tools: int = 0
    error: bool = False


class TextStream:
    """The turn's text as it grows: ``record`` says what changed in ``view`` since the last call, ``take``
    hands the text said since the last take, as ``(stream name, text)`` chunks."""

    def __init__(self, view: TurnView) -> None:
        self.view = view
        self._chunks: list[tuple[str, str]] = [("stdout", "Fleet · ")]
        self._started = self._outcome = False
        self._agents = self._artifacts = 0
        self._said: dict[int, _Said] = {}

    def take(self) -> list[tuple[str, str]]:
        chunks, self._chunks = self._chunks, []
        return chunks

    def _say(self, text: str, name: str = "stdout") -> None:
        if not text:
            return
        if self._chunks and self._chunks[-1][0] == name:
            self._chunks[-1] = (name, self._chunks[-1][1] + text)
        else:
            self._chunks.append((name, text))

    def record(self, touched: IterationView | None) -> None:
        """Say what changed in the view: in the iteration ``touched``, and in the turn."""
        view = self.view
        if view.started and not self._started:
            self._started = True
            self._say(f"{view.model or 'no model'} · sandbox {view.sandbox} · up to {view.max_iters} iterations\n")
        if touched is not None:
            self._iteration(touched)
        for agent in list(view.agents.values())[self._agents :]:
            who = agent_prefix(agent.parent_agent_id or "root")
            self._say(f"{who}child RLM {agent.agent_id} started: {agent.task}\n")
        self._agents = len(view.agents)
        for art in view.artifacts[self._artifacts :]:
            self._say(artifact_line(art, "artifact: ", mime=False) + "\n")
        self._artifacts = len(view.artifacts)
        if view.done and not self._outcome:
            self._outcome = True
            self._say(f"\n── {view.summary()}\n")

    def _iteration(self, it: IterationView) -> None:
        said = self._said.setdefault(id(it), _Said())
        who = agent_prefix(it.agent_id)
        if not said.header:
            said.header = True
            self._say(f"\n── {who}iteration {it.iteration}/{it.max_iters} " + "─" * 24 + "\n")
        self._thinking(it, said, who)
        self._reasoning(it, said.reasoning, who)
        self._code(it, said, who)
        for stream, text in it.chunks[said.chunks :]:
            self._say(text, stream)
        said.chunks = len(it.chunks)
        if it.output_dropped and not said.dropped:
            said.dropped = True
            self._say("\n... (more output: the transcript and the store keep it)\n")
        for tool in it.tools[said.tools :]:
            self._say(f"{who}→ {tool}\n")
        said.tools = len(it.tools)
        if it.error and not said.error:
            said.error = True
            self._say(f"{who}error: {error_line(it.error)}\n", "stderr")

    def _thinking(self, it: IterationView, said: _Said, who: str) -> None:
        """``thinking…`` while the provider's thinking streams, then how long it was: a terminal cannot fold
        text away, so the thinking itself is left to the transcript and ``lm.finished``."""
        if said.thinking == "" and it.live_thinking:
            said.thinking = "open"
            self._say(f"{who}thinking… ")
        if said.thinking == "open" and (it.thinking or it.shown_reasoning or it.shown_code):
            said.thinking = "done"
            chars = sum(len(text) for text in it.thinking) or len(it.live_thinking)
            self._say(f"({chars:,} characters)\n")

    def _reasoning(self, it: IterationView, grow: _Growing, who: str) -> None:
        """``reasoning: ...`` as its tokens arrive, completed (or restated) by the step's own text."""
        if grow.done:
            return
        head = f"{who}reasoning: "
        if it.reasoning:
            final = it.reasoning.strip()
            grow.done = True
            if grow.printed == final:
                self._say("\n" if grow.open else "")
            elif grow.open and final.startswith(grow.printed):
                self._say(final[len(grow.printed) :] + "\n")
            else:
                self._say(("\n" if grow.open else "") + f"{head}{final}\n")
            grow.open = False
            return
        if it.live_reasoning and it.live_reasoning != grow.printed:
            self._grow(grow, it.live_reasoning, head)

    def _code(self, it: IterationView, said: _Said, who: str) -> None:
        """``code:`` and the fenced code as its tokens arrive, then ``output:`` once the step's code is known."""
        grow = said.code
        if grow.done:
            return
        head = f"{who}code:\n    ```python\n    "
        if it.code:
            grow.done = True
            tail = f"{who}output:\n"
            if grow.open and it.code.startswith(grow.printed):
                self._say(indent_more(it.code[len(grow.printed) :].rstrip("\n")) + "\n    ```\n" + tail)
            else:
                self._say(("\n" if grow.open else "") + f"{who}code:\n{indent(fence(it.code, 'python'))}\n{tail}")
            grow.open = False
            return
        if not it.live_code or it.live_code == grow.printed:
            return
        if said.reasoning.open:  # the reasoning's tokens are over: end its line
            self._say("\n")
            said.reasoning.open = False
        self._grow(grow, it.live_code, head, indent_more)

    def _grow(self, grow: _Growing, live: str, head: str, shape: Callable[[str], str] = str) -> None:
        """Say what ``live`` adds to what was printed; the first tokens, or another call's, start the line (again)."""
        if grow.open and live.startswith(grow.printed):
            self._say(shape(live[len(grow.printed) :]))
        else:
            self._say(("\n" if grow.open else "") + head + shape(live))
        grow.printed, grow.open = live, True
