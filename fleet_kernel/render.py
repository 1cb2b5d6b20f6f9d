"""HTML and text fragments of one iteration (and a turn's status line), written once for the transcript, the
widget and plain displays (the text around them, whole or as it grows, is ``render_text``'s).

Every model-written string is escaped here; code is highlighted with Pygments. Code and output are set in
monospace and wrap at spaces, even where the host page styles ``pre`` (nbconvert's HTML does).
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

from fleet_kernel.view import IterationView, TurnView

SHOW_OUTPUT_CHARS = 4_000
"""Output shown per iteration in a transcript."""
MONO = "font-family:var(--jp-code-font-family,SFMono-Regular,Menlo,Consolas,monospace)"
"""Code and output are set in monospace even where the host page styles ``pre`` (nbconvert's HTML does)."""
WRAP = "white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere"
"""Long lines wrap at spaces (at any character only when a word is wider than the page)."""


def model_name(model: str | None) -> str:
    """The model as shown: a replay cassette by its file name, not its path on this machine."""
    if model and model.startswith("replay/"):
        return "replay/" + model.rstrip("/").rsplit("/", 1)[-1]
    return model or ""


def turn_header(view: TurnView) -> str:
    """``Fleet · <summary> · <model> · sandbox <name>``: a transcript's first line, in every format."""
    model = model_name(view.model)
    where = " · ".join(x for x in (model, f"sandbox {view.sandbox}" if view.sandbox else "") if x)
    return f"Fleet · {view.summary()}" + (f" · {where}" if where else "")


def clip(text: str, limit: int = SHOW_OUTPUT_CHARS, dropped: int = 0) -> str:
    """``text`` cut to ``limit`` characters with a note saying how much more the store keeps."""
    extra = max(len(text) - limit, 0) + dropped
    if not extra:
        return text
    return text[:limit].rstrip("\n") + f"\n... ({extra:,} more characters; the store keeps the full output)\n"


def fence(text: str, lang: str = "") -> str:
    """A Markdown code fence longer than any backtick run inside ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def highlight_python(code: str) -> str:
    # pygments: ~0.1 s, only when code is shown as HTML
    from pygments import highlight  # noqa: PLC0415 - pygments
    from pygments.formatters import HtmlFormatter  # noqa: PLC0415 - pygments (~0.2 s) only when HTML is rendered
    from pygments.lexers import PythonLexer  # noqa: PLC0415 - pygments

    formatter = HtmlFormatter(noclasses=True, nobackground=True, prestyles=f"{WRAP};{MONO}")
    highlighted: str = highlight(code, PythonLexer(), formatter)
    return highlighted


def iteration_note(it: IterationView) -> str:
    """`` · ran 0.12 s · ErrorType`` once the code ran."""
    note = ""
    if it.duration_ms is not None:
        note += f" · ran {it.duration_ms / 1000:.2f} s"
    if it.error:
        note += f" · {it.error.get('type', 'error')}"
    return note


def error_line(error: dict[str, Any]) -> str:
    """``Type: message`` of an iteration's ``error``."""
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"


def reasoning_html(text: str) -> str:
    return f'<div style="white-space:pre-wrap;font-style:italic">{html.escape(text)}</div>'


def thinking_html(it: IterationView, *, live: bool = False) -> str:
    """The provider's own thinking, collapsed and dimmed: it can be long, and it is not what the step says.
    ``live``: with what has streamed of it so far (``live_thinking``), which a transcript never shows."""
    texts = [*it.thinking, it.live_thinking] if live and it.live_thinking else it.thinking
    if not texts:
        return ""
    text = "\n\n".join(texts)
    growing = "so far, " if live and it.live_thinking else ""
    return (
        f"<details><summary>the model's thinking ({growing}{len(text):,} characters)</summary>"
        f'<div style="white-space:pre-wrap;opacity:0.8">{html.escape(text)}</div></details>'
    )


def head_html(it: IterationView, *, live: bool = False) -> str:
    """What the model thought and wrote: reasoning, then highlighted code; ``live``: as far as it has
    streamed (``shown_reasoning``), where a transcript shows only the step's own text."""
    reasoning, code = (it.shown_reasoning, it.shown_code) if live else (it.reasoning, it.code)
    thinking = thinking_html(it, live=live)
    parts = [thinking] if thinking else []
    if reasoning:
        parts.append(reasoning_html(reasoning))
    if code:
        parts.append(highlight_python(code))
    return "\n".join(parts)


def output_html(shown: str) -> str:
    style = f"border-left:3px solid #999;padding-left:6px;{WRAP};{MONO}"
    return f'<pre style="{style}">{html.escape(shown)}</pre>'


def error_html(error: dict[str, Any]) -> str:
    return f'<pre style="color:#b00;{WRAP};{MONO}">{html.escape(error_line(error))}</pre>'


def tools_html(it: IterationView) -> str:
    return "\n".join(f'<div>tool: <code style="{MONO}">{html.escape(tool)}</code></div>' for tool in it.tools)


def iteration_html(it: IterationView, *, output_limit: int = SHOW_OUTPUT_CHARS) -> str:
    """Reasoning, highlighted code, output, tool calls and error of one iteration (escaped)."""
    parts = [head_html(it)] if it.reasoning or it.code else []
    if it.output or it.output_dropped:
        parts.append(output_html(clip(it.output, output_limit, it.output_dropped)))
    if it.tools:
        parts.append(tools_html(it))
    if it.error:
        parts.append(error_html(it.error))
    return "\n".join(parts)


def status_line(view: TurnView, started: float) -> str:
    """``iteration i/max · LM calls · tokens · cost · elapsed``, plus the outcome once known."""
    if not view.turn_id:
        return "starting the turn…"
    current = view.current
    iteration = f"iteration {current.iteration}/{current.max_iters}" if current else "waiting for the model"
    elapsed = view.duration_ms / 1000 if view.duration_ms is not None else time.monotonic() - started
    parts = [
        iteration,
        f"{view.lm_calls} LM calls",
        f"{view.tokens:,} tokens",
        f"${view.cost_usd:.4f}",
        f"{elapsed:.1f} s",
    ]
    state = "running" if not view.done else view.status
    return f"{state} · " + " · ".join(parts)
