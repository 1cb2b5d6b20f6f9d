"""A turn's stored events as a readable transcript, and a whole session as a notebook.

The turn is read through its ``TurnView`` (``fleet_kernel.view``), the one fold of its events that the
kernel's live displays read too. ``transcript_bundle`` renders the view as one
mimebundle (``text/markdown``, escaped ``text/html``, ``text/plain``) that reads well in JupyterLab
without widgets, on GitHub, in ``jupyter console`` and through nbconvert. ``session_notebook`` exports
a session as an nbformat 4 notebook: one cell per turn, its task as source, its transcript and
artifact images as outputs. Nothing here needs a running kernel.
"""

from __future__ import annotations

import base64
import html
import re
import unicodedata
from typing import TYPE_CHECKING, Any

from fleet_kernel import identity
from fleet_kernel.events import Event
from fleet_kernel.markdown import NO_MATH, md_block, md_escape
from fleet_kernel.render import (
    MONO,
    SHOW_OUTPUT_CHARS,
    WRAP,
    clip,
    fence,
    highlight_python,
    iteration_html,
    iteration_note,
    model_name,
    turn_header,
)
from fleet_kernel.render_text import artifact_line, render_text
from fleet_kernel.textsafe import terminal_safe
from fleet_kernel.view import KEEP_OUTPUT_CHARS, IterationView, TurnView

__all__ = [  # the view and the fragments, for code that reads them from here
    "KEEP_OUTPUT_CHARS", "SHOW_OUTPUT_CHARS", "IterationView", "TurnView", "clip", "fence", "highlight_python",
    "iteration_html", "iteration_note", "render_html", "render_markdown", "render_text", "session_notebook",
    "transcript_bundle", "turn_view",
]  # fmt: skip

if TYPE_CHECKING:
    import nbformat

    from fleet_kernel.store import SessionRow, Store, TurnRow

OPEN_ITERATIONS = 3
"""A transcript with this many iterations or fewer shows them expanded; longer ones start collapsed."""
INLINE_IMAGE_MIMES = ("image/png", "image/jpeg")
MAX_INLINE_IMAGE_BYTES = 5 * 1024 * 1024
SLUG_CHARS = 48
ERROR_NAMES = {"cancelled": "TurnCancelled", "failed": "TurnFailed", "interrupted": "TurnFailed"}
WRAP_PROMPTS = f"<style>.jp-Cell:has(.fleet-transcript) .jp-InputArea-editor pre{{{WRAP}}}</style>"
"""Static HTML (nbconvert) wraps a long prompt instead of cutting it off; only cells holding a transcript."""


# ---------------------------------------------------------------------------------------------- rendering


def render_markdown(view: TurnView) -> str:
    """The transcript as Markdown: the model's reasoning and answer render as it wrote them, maths and HTML aside."""
    lit = _literal
    parts = [f"*{lit(turn_header(view))}*"]
    for it in view.iterations:
        parts.append(f"#### {lit(it.label[0].upper() + it.label[1:])}")
        if it.reasoning:
            parts.append("\n".join("> " + line for line in md_escape(it.reasoning).splitlines()))
        if it.code:
            parts.append(fence(it.code, "python"))
        if it.output or it.output_dropped:
            parts.append(fence(clip(it.output, dropped=it.output_dropped), "text"))
        if it.error:
            parts.append(f"**{lit(it.error.get('type', 'Error'))}**: {lit(it.error.get('message', ''))}")
    parts += ["- " + lit(artifact_line(art, "")) for art in view.artifacts]
    if view.status == "completed":
        parts += ["---", "### Answer"]
        if view.extraction_note():
            parts.append(f"**{lit(view.extraction_note())}**")
        parts.append(md_escape(view.answer) if view.answer else "*(empty answer)*")
    elif view.outcome_text():
        parts += ["---", f"**{lit(view.outcome_text())}**"]
    return md_block("\n\n".join(parts))


def _literal(text: str) -> str:
    return md_escape(text, literal=True)


def render_html(view: TurnView) -> str:
    """The transcript as self-contained HTML; every model-written string is escaped."""
    esc = html.escape
    out = [
        WRAP_PROMPTS,
        f'<div class="fleet-transcript {NO_MATH}"><p style="opacity:.75"><em>{esc(turn_header(view))}</em></p>',
    ]
    opened = " open" if len(view.iterations) <= OPEN_ITERATIONS else ""
    for it in view.iterations:
        out.append(f"<details{opened}><summary><b>{esc(it.label)}</b>{esc(iteration_note(it))}</summary>")
        out.append(iteration_html(it))
        out.append("</details>")
    for art in view.artifacts:
        out.append(f'<div>artifact: <code style="{MONO}">{esc(artifact_line(art, ""))}</code></div>')
    if view.status == "completed":
        out.append("<hr/>")
        if view.extraction_note():
            out.append(f'<p class="fleet-extracted"><b>{esc(view.extraction_note())}</b></p>')
        out.append(f'<div class="fleet-answer">{markdown_html(view.answer or "*(empty answer)*")}</div>')
    elif view.outcome_text():
        out.append(f"<hr/><p><b>{esc(view.outcome_text())}</b></p>")
    out.append("</div>")
    return "\n".join(out)


def markdown_html(text: str) -> str:
    """Markdown to HTML with raw HTML disabled, so the model's text cannot inject markup.

    Without markdown-it-py the text is shown as it is, escaped (``text/markdown`` still renders it).
    """
    try:
        from markdown_it import MarkdownIt  # noqa: PLC0415 - ~0.1 s, and optional: only turns with a transcript need it
    except ImportError:
        return f'<div style="white-space:pre-wrap">{html.escape(text)}</div>'
    rendered: str = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return rendered


def transcript_bundle(view: TurnView) -> tuple[dict[str, str], dict[str, Any]]:
    """The final output of a turn: ``(data, metadata)`` for an ``execute_result``."""
    data = {"text/markdown": render_markdown(view), "text/html": render_html(view), "text/plain": render_text(view)}
    for mime in ("text/markdown", "text/plain"):  # events are terminal-safe; older ones and turn rows may not be
        data[mime] = terminal_safe(data[mime])
    meta = {
        "fleet": {"session_id": view.session_id, "turn_id": view.turn_id, "status": view.status, "model": view.model}
    }
    return data, meta


def error_content(view: TurnView) -> dict[str, Any] | None:
    """``{ename, evalue, traceback}`` for a cancelled or failed turn, else ``None``."""
    if view.status not in ERROR_NAMES:
        return None
    ename = ERROR_NAMES[view.status]
    evalue = view.reason if view.status == "cancelled" else (view.error or {}).get("message", view.status)
    evalue = terminal_safe(evalue)
    return {"ename": ename, "evalue": evalue, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]}


def image_bundle(path: str, mime: str, data: bytes) -> tuple[dict[str, str], dict[str, Any]]:
    return {mime: base64.b64encode(data).decode("ascii"), "text/plain": f"<artifact {path}>"}, {"fleet": {"path": path}}


def inline_images(view: TurnView) -> list[dict[str, Any]]:
    """The turn's artifacts that are shown inline (PNG/JPEG up to a size)."""
    return [a for a in view.artifacts if a["mime"] in INLINE_IMAGE_MIMES and a["size"] <= MAX_INLINE_IMAGE_BYTES]


# ---------------------------------------------------------------------------------------------- notebooks


async def turn_view(store: Store, turn: TurnRow) -> TurnView:
    return TurnView.of(await _all_events(store, turn.turn_id), turn)


async def _all_events(store: Store, turn_id: str) -> list[Event]:
    events: list[Event] = []
    while True:
        batch = await store.events_after(turn_id, events[-1].seq if events else 0)
        if not batch:
            return events
        events += batch


async def turn_outputs(store: Store, view: TurnView, execution_count: int) -> list[nbformat.NotebookNode]:
    """A turn's notebook outputs: artifact images, the transcript, and an error for a failed turn."""
    from nbformat import v4  # noqa: PLC0415 - slow to import (~2 s); only turns shown in a notebook need it

    outputs = []
    for art in inline_images(view):
        data, meta = image_bundle(art["path"], art["mime"], await store.get_blob(art["sha256"]))
        outputs.append(v4.new_output("display_data", data=data, metadata=meta))
    data, meta = transcript_bundle(view)
    outputs.append(v4.new_output("execute_result", data=data, metadata=meta, execution_count=execution_count))
    error = error_content(view)
    if error is not None:
        outputs.append(v4.new_output("error", **error))
    return outputs


async def session_notebook(store: Store, session_id: str) -> nbformat.NotebookNode:
    """The session as an nbformat 4 notebook for the ``fleet`` kernel, as it stands: one cell per
    notebook cell (its latest completed turn, else its latest), and one per turn without a cell.

    Raises:
        NotFoundError: unknown session.
    """
    # slow to import (~2 s); only exports need it
    import nbformat  # noqa: PLC0415 - nbformat only for an export
    from nbformat import v4  # noqa: PLC0415 - nbformat (~2 s with jsonschema) only for an export

    session = await store.get_session(session_id)
    turns = await store.standing_turns(session_id)
    views = [await turn_view(store, turn) for turn in turns]
    cells = [v4.new_markdown_cell(title_markdown(session, views), metadata={"fleet": {"role": "title"}})]
    for turn, view in zip(turns, views, strict=True):
        cell = v4.new_code_cell(source=turn.task, execution_count=turn.position)
        cell.outputs = await turn_outputs(store, view, turn.position)
        cell.metadata["fleet"] = {"turn_id": turn.turn_id, "status": turn.status}
        cells.append(cell)
    nb: nbformat.NotebookNode = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(identity.KERNELSPEC)
    nb.metadata["language_info"] = dict(identity.LANGUAGE_INFO)
    nb.metadata["fleet"] = {"session_id": session.session_id, "title": session.title}
    nbformat.validate(nb)
    return nb


def title_markdown(session: SessionRow, turns: list[TurnView]) -> str:
    """The exported notebook's first cell: the session's title, its models and its dates."""
    models = list(dict.fromkeys(model_name(t.model) for t in turns if t.model))
    facts = [
        f"Fleet session `{session.session_id}`",
        f"{len(turns)} turn{'s' * (len(turns) != 1)}",
        f"model{'s' * (len(models) > 1)}: {', '.join(f'`{m}`' for m in models)}" if models else "no model yet",
        f"created {session.created_at:%Y-%m-%d %H:%M} UTC",
        f"updated {session.updated_at:%Y-%m-%d %H:%M} UTC",
    ]
    title = (session.title or "Untitled session").replace("\n", " ")
    return md_block(f"# {_literal(title)}\n\n" + " · ".join(facts))


def notebook_filename(session: SessionRow) -> str:
    """``fleet-<slug of the title>-<short id>.ipynb``: ASCII, lower case, safe in any folder or header."""
    ascii_title = unicodedata.normalize("NFKD", session.title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")[:SLUG_CHARS].rstrip("-")
    short = session.session_id.partition("_")[2][:8] or session.session_id[:8]
    return "-".join(part for part in ("fleet", slug, short) if part) + ".ipynb"
