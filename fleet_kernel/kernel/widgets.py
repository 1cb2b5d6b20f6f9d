"""The live ipywidgets card of one turn: a status line, a Stop button, one collapsible section per iteration;
and the feedback bar (👍/👎 and a note) under a finished turn's answer.

The card only mirrors a ``TurnView``: ``sync`` copies what changed since the last call into the widgets
(one ``hold_sync`` per widget, so one comm message each), and finished iterations are collapsed and
never touched again. The card is a live view only; the cell's record is the transcript that replaces it.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from concurrent.futures import Future

import ipywidgets as w
from ipywidgets.widgets.widget_string import HTMLStyle

from fleet_kernel.render import clip, error_html, head_html, iteration_note, output_html, status_line
from fleet_kernel.view import IterationView, TurnView

LIVE_OUTPUT_CHARS = 32_000
STATUS_REFRESH_S = 1.0
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


class _Shared:
    """One layout and one HTML style for every plain widget of a card: fewer models, fewer comm messages."""

    def __init__(self) -> None:
        self.layout = w.Layout()
        self.style = HTMLStyle()

    def html(self, value: str = "") -> w.HTML:
        return w.HTML(value=value, layout=self.layout, style=self.style)


class _Section:
    """One iteration: a collapsible accordion holding its reasoning and code, and its output."""

    def __init__(self, it: IterationView, shared: _Shared) -> None:
        self.shown = _state(it)
        self.head = shared.html(_head_html(it))
        self.output = shared.html(_output_html(it))
        self.inner = w.VBox([self.head, self.output], layout=shared.layout)
        open_index = None if it.finished else 0
        self.box = w.Accordion([self.inner], titles=(_title(it),), selected_index=open_index, layout=shared.layout)
        self.frozen = it.finished

    def sync(self, it: IterationView) -> None:
        state = _state(it)
        if state == self.shown:
            return
        if state[:3] != self.shown[:3]:
            self.head.value = _head_html(it)
        if state[3] != self.shown[3] or it.error:
            self.output.value = _output_html(it)
        if state[4] != self.shown[4]:
            self.box.titles = (_title(it),)
        self.shown = state

    def freeze(self, it: IterationView) -> None:
        with self.box.hold_sync():
            self.sync(it)
            self.box.selected_index = None
        self.frozen = True

    def widgets(self) -> list[w.Widget]:
        return [self.box, self.inner, self.head, self.output]


def _state(it: IterationView) -> tuple[str, str, int, int, float | None]:
    thought = len(it.live_thinking) + sum(len(text) for text in it.thinking)
    return (it.shown_reasoning, it.shown_code, thought, len(it.output) + it.output_dropped, it.duration_ms)


def _title(it: IterationView) -> str:
    return it.label + iteration_note(it)


def _head_html(it: IterationView) -> str:
    return head_html(it, live=True) or "<em>thinking…</em>"


def _output_html(it: IterationView) -> str:
    parts = []
    if it.output:
        text = it.output
        if len(text) > LIVE_OUTPUT_CHARS:
            text = (
                f"... ({len(text) - LIVE_OUTPUT_CHARS:,} earlier characters not shown live)\n"
                + text[-LIVE_OUTPUT_CHARS:]
            )
        parts.append(output_html(clip(text, LIVE_OUTPUT_CHARS + 200, it.output_dropped)))
    if it.error:
        parts.append(error_html(it.error))
    return "\n".join(parts)


class TurnCard:
    """The widget tree of one running turn."""

    def __init__(self, view: TurnView, on_stop: Callable[[], object] | None) -> None:
        """``on_stop`` None: no Stop button (a python3 kernel handles no comm message while a cell runs)."""
        self.view = view
        self.started = time.monotonic()
        self.shared = _Shared()
        self.status = self.shared.html(self._status_html())
        self._status_counts, self._status_sent = "", time.monotonic()
        self.stop = w.Button(
            description="Stop",
            icon="stop",
            button_style="danger",
            tooltip="Cancel this turn",
            layout=w.Layout(width="90px"),
        )
        if on_stop is not None:
            self.stop.on_click(lambda _button: self._stop(on_stop))
        self.sections: list[tuple[IterationView, _Section]] = []
        self.body = w.VBox([], layout=self.shared.layout)
        head = [self.status, self.stop] if on_stop is not None else [self.status]
        self.root = w.VBox([w.HBox(head, layout=self.shared.layout), self.body], layout=self.shared.layout)

    def _stop(self, on_stop: Callable[[], object]) -> None:
        self.stop.disabled = True
        self.stop.description = "Stopping"
        on_stop()

    def _status_html(self) -> str:
        return f"<b>Fleet</b> · {html.escape(status_line(self.view, self.started))}"

    def bundle(self) -> dict[str, object]:
        """The display_data bundle: the widget view and a readable fallback for frontends without widgets."""
        text = f"Fleet turn {self.view.turn_id}: {status_line(self.view, self.started)} (live view needs ipywidgets)"
        return {
            WIDGET_VIEW_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.root.model_id},
            "text/plain": text,
            "text/html": f"<p>{html.escape(text)}</p>",
        }

    def sync(self) -> None:
        """Copy what changed in the view into the widgets; collapse and freeze finished iterations."""
        known = {id(it) for it, _ in self.sections}
        added = [it for it in self.view.iterations if id(it) not in known]
        for it, section in self.sections:
            if not section.frozen:
                section.freeze(it) if it.finished else section.sync(it)
        for it in added:
            self.sections.append((it, _Section(it, self.shared)))
        if added:
            self.body.children = tuple(section.box for _, section in self.sections)
        self._sync_status()
        if self.view.done:
            self.stop.layout.display = "none"

    def _sync_status(self) -> None:
        """Resend the status when a count changes, and for the elapsed time at most once a second."""
        value, now = self._status_html(), time.monotonic()
        counts = value.rsplit(" · ", 1)[0]
        if counts != self._status_counts or now - self._status_sent >= STATUS_REFRESH_S or self.view.done:
            self.status.value = value
            self._status_counts, self._status_sent = counts, now

    def close(self) -> None:
        """Close every widget (the card is replaced by the transcript)."""
        widgets = [self.root, *self.root.children, self.status, self.stop, self.stop.layout, self.stop.style]
        widgets += [self.shared.layout, self.shared.style]
        for _, section in self.sections:
            widgets += section.widgets()
        for widget in widgets:
            widget.close()


class FeedbackBar:
    """👍/👎 and an optional note under a finished turn's answer: a click keeps the mark, as ``%fleet feedback`` does.

    ``record(rating, note)`` stores the mark and returns a future: the store lives on Fleet's loop, which
    in the ``%%fleet`` magic is another thread's. The bar is disabled until the future is done, then
    says what was kept, or shows why not and lets the user try again.
    """

    def __init__(self, turn_id: str, record: Callable[[str, str], Future[object]]) -> None:
        self.turn_id = turn_id
        self._record = record
        self.layout = w.Layout(width="auto")
        # FontAwesome icons (JupyterLab ships them) and a word: emoji need a font the browser may lack
        self.good = w.Button(description="good", icon="thumbs-up", tooltip="Mark this answer good", layout=self.layout)
        self.bad = w.Button(description="bad", icon="thumbs-down", tooltip="Mark this answer bad", layout=self.layout)
        self.note = w.Text(placeholder="note (optional)", layout=w.Layout(width="320px"))
        self.label = w.Label(value="", layout=self.layout)
        self.good.on_click(lambda _button: self._click("good"))
        self.bad.on_click(lambda _button: self._click("bad"))
        self.root = w.HBox([self.good, self.bad, self.note, self.label], layout=self.layout)

    def bundle(self) -> dict[str, object]:
        """The display_data bundle: the widget view, and how to mark the answer without widgets."""
        text = f"Mark this answer: %fleet feedback good|bad [note] --turn {self.turn_id}"
        return {
            WIDGET_VIEW_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.root.model_id},
            "text/plain": text,
            "text/html": f"<p>{html.escape(text)}</p>",
        }

    def _click(self, rating: str) -> None:
        if self.good.disabled:  # recording or recorded: a stale frontend's click changes nothing
            return
        self._enable(False)
        self.label.value = "recording…"
        note = self.note.value.strip()
        self._record(rating, note).add_done_callback(lambda done: self._recorded(rating, note, done))

    def _recorded(self, rating: str, note: str, done: Future[object]) -> None:
        error = done.exception() if not done.cancelled() else RuntimeError("cancelled")
        if error is not None:
            self._enable(True)
            self.label.value = f"not recorded: {getattr(error, 'message', None) or error}"
            return
        self.label.value = f"marked {rating}" + (f": {note}" if note else "")

    def _enable(self, enabled: bool) -> None:
        for widget in (self.good, self.bad, self.note):
            widget.disabled = not enabled
