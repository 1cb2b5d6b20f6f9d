"""Turning a turn's events into IOPub messages, throttled, for three kinds of frontend.

- ``WidgetLive`` (JupyterLab and other widget frontends): one ipywidgets card per turn, updated in place.
- ``PlainLive`` (nbclient, nbconvert, frontends without widgets): a status ``display_data`` updated by
  ``update_display_data``, one display per iteration (reasoning and code), and the code's output as
  ``stream`` messages while it prints.
- ``TextLive`` (``jupyter console``, ``%fleet output text``): everything as readable ``stream`` lines.

All three fold events into a ``TurnView`` and flush at most every ``FLUSH_INTERVAL_S`` (the first
event goes out at once, the last state always goes out), so a chatty turn stays well under
JupyterLab's IOPub rate limit. ``finish_turn`` then replaces the live view with the turn's record:
artifact images and one ``execute_result`` carrying the transcript.
"""

from __future__ import annotations

import asyncio
import html
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet_kernel.events import Event
from fleet_kernel.transcript import (
    TurnView,
    error_content,
    fence,
    highlight_python,
    image_bundle,
    inline_images,
    iteration_note,
    transcript_bundle,
)

if TYPE_CHECKING:
    from fleet_kernel.store import Store

FLUSH_INTERVAL_S = 0.25
TICK_S = 1.0
MAX_STREAM_CHARS = 64 * 1024
MAX_LIVE_OUTPUT_CHARS = 200_000


class Publisher:
    """Sends IOPub messages for one request, from the kernel's loop, with an explicit parent."""

    def __init__(self, kernel: Any, parent: dict[str, Any]) -> None:
        self.kernel = kernel
        self.parent = parent
        self.sent = 0

    def send(self, msg_type: str, content: dict[str, Any]) -> None:
        self.sent += 1
        self.kernel.session.send(
            self.kernel.iopub_socket, msg_type, content, parent=self.parent, ident=self.kernel._topic(msg_type)
        )

    def stream(self, name: str, text: str) -> None:
        if len(text) > MAX_STREAM_CHARS:
            text = text[:MAX_STREAM_CHARS] + f"\n... ({len(text) - MAX_STREAM_CHARS:,} characters not shown)\n"
        self.send("stream", {"name": name, "text": text})

    def display(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        *,
        display_id: str | None = None,
        update: bool = False,
    ) -> None:
        content: dict[str, Any] = {"data": data, "metadata": metadata or {}}
        if display_id is not None:
            content["transient"] = {"display_id": display_id}
        self.send("update_display_data" if update else "display_data", content)

    def clear(self) -> None:
        self.send("clear_output", {"wait": True})


class _Live:
    """Folds events into ``view`` and flushes what changed, at most every ``FLUSH_INTERVAL_S``."""

    def __init__(self, pub: Publisher, view: TurnView) -> None:
        self.pub = pub
        self.view = view
        self.started = time.monotonic()
        self._last_flush = 0.0
        self._pending: asyncio.TimerHandle | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def begin(self) -> None:
        """Show the turn at once, before the engine has even claimed it; its first event also goes out at once."""
        self.flush()

    def on_event(self, event: Event) -> None:
        self.view.apply(event)
        self.record(event)
        self._schedule()

    def record(self, event: Event) -> None:
        """Note what this event changes (subclasses); sending happens in ``flush``."""

    def flush(self) -> None:
        """Send everything noted since the last flush (subclasses)."""

    def _schedule(self) -> None:
        if self._pending is not None:
            return
        wait = self._last_flush + FLUSH_INTERVAL_S - time.monotonic()
        self._pending = self._loop.call_later(max(wait, 0.0), self._flush_now)

    def _flush_now(self) -> None:
        self._pending = None
        self._last_flush = time.monotonic()
        self.flush()
        if self._ticker is None and not self.view.done:
            self._ticker = self._loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        """Refresh the elapsed time while nothing else happens."""
        self._ticker = None
        if not self.view.done:
            self.on_tick()
            self._schedule()

    def on_tick(self) -> None:
        pass

    def _stop_timers(self) -> None:
        for handle in (self._pending, self._ticker):
            if handle is not None:
                handle.cancel()
        self._pending = self._ticker = None

    async def finish(self) -> None:
        """Deliver the last state now and stop the timers."""
        self._stop_timers()
        self.flush()

    def close(self) -> None:
        """Stop the timers and release what the live view holds (widgets)."""
        self._stop_timers()


class TextLive(_Live):
    """Readable text lines as ``stream`` messages: for terminals, which ignore display updates."""

    def __init__(self, pub: Publisher, view: TurnView) -> None:
        super().__init__(pub, view)
        self._chunks: list[tuple[str, str]] = [("stdout", "Fleet · ")]

    def _say(self, text: str, name: str = "stdout") -> None:
        if self._chunks and self._chunks[-1][0] == name:
            self._chunks[-1] = (name, self._chunks[-1][1] + text)
        else:
            self._chunks.append((name, text))

    def record(self, event: Event) -> None:
        data, view = event.data, self.view
        who = "" if event.agent_id == "root" else f"[{event.agent_id}] "
        if event.type == "turn.started":
            self._say(
                f"{data.get('model') or 'no model'} · sandbox {data.get('sandbox')} · "
                f"up to {data['limits']['max_iters']} iterations\n"
            )
        elif event.type == "iteration.started":
            self._say(f"\n── {who}iteration {data['iteration']}/{data['max_iters']} " + "─" * 24 + "\n")
        elif event.type == "reasoning" and data["text"]:
            self._say(f"{who}reasoning: {data['text'].strip()}\n")
        elif event.type == "code" and data["code"]:
            self._say(f"{who}code:\n{_indent(fence(data['code'], 'python'))}\n{who}output:\n")
        elif event.type == "output":
            self._say(data["text"], data["stream"])
        elif event.type == "execution.finished" and data.get("error"):
            self._say(f"{who}error: {data['error']['type']}: {data['error']['message']}\n", "stderr")
        elif event.type == "tool.started":
            self._say(f"{who}→ {data['name']}({data['args_preview']})\n")
        elif event.type == "agent.started":
            self._say(f"{who}child RLM {data['agent_id']} started: {data['task']}\n")
        elif event.type == "artifact":
            self._say(f"artifact: {data['path']} ({data['size']:,} bytes)\n")
        elif event.terminal:
            self._say(f"\n── {view.summary()}\n")

    def flush(self) -> None:
        chunks, self._chunks = self._chunks, []
        for name, text in chunks:
            self.pub.stream(name, text)


class PlainLive(_Live):
    """Plain displays and streams: live in any frontend, and the final state is what nbclient saves."""

    def __init__(self, pub: Publisher, view: TurnView) -> None:
        super().__init__(pub, view)
        self._ops: list[tuple[str, Any]] = []
        self._dirty: set[int] = set()
        self._shown: dict[int, str] = {}
        self._status_shown = False
        self._live_chars = 0
        self._prefix = f"fleet-{uuid.uuid4().hex[:16]}"  # fresh per run: never reuse a display id

    def _id(self, index: int) -> str:
        return f"{self._prefix}-{index}"

    def record(self, event: Event) -> None:
        if event.type in ("reasoning", "code", "execution.finished"):
            it = next(
                i
                for i in reversed(self.view.iterations)
                if i.iteration == event.data["iteration"] and i.agent_id == event.agent_id
            )
            index = self.view.iterations.index(it)
            if index not in self._shown:
                self._shown[index] = self._id(index)
                self._ops.append(("display", index))
            elif ("display", index) not in self._ops:
                self._dirty.add(index)
        elif event.type == "output":
            text = event.data["text"]
            room = MAX_LIVE_OUTPUT_CHARS - self._live_chars
            if room <= 0:
                return
            if len(text) > room:
                text = text[:room] + "\n... (more output: the transcript and the store keep it)\n"
            self._live_chars += len(text)
            stream = event.data["stream"]
            if self._ops and self._ops[-1][0] == "stream" and self._ops[-1][1][0] == stream:
                self._ops[-1] = ("stream", (stream, self._ops[-1][1][1] + text))
            else:
                self._ops.append(("stream", (stream, text)))

    def _iteration_bundle(self, index: int) -> dict[str, str]:
        it = self.view.iterations[index]
        note = iteration_note(it)
        text = (
            f"── {it.label}{note}\n"
            + (f"{it.reasoning}\n" if it.reasoning else "")
            + (fence(it.code, "python") if it.code else "")
        )
        body = f"<b>{html.escape(it.label)}</b>{html.escape(note)}"
        if it.reasoning:
            body += f'<div style="white-space:pre-wrap;font-style:italic">{html.escape(it.reasoning)}</div>'
        if it.code:
            body += highlight_python(it.code)
        return {"text/plain": text, "text/html": body}

    def _status_bundle(self) -> dict[str, str]:
        from fleet_kernel.kernel.widgets import status_line

        line = status_line(self.view, self.started)
        return {"text/plain": f"Fleet · {line}", "text/html": f"<p><b>Fleet</b> · {html.escape(line)}</p>"}

    def flush(self) -> None:
        ops, dirty = self._ops, self._dirty
        self._ops, self._dirty = [], set()
        self.pub.display(self._status_bundle(), display_id=self._id(-1), update=self._status_shown)
        self._status_shown = True
        for kind, value in ops:
            if kind == "stream":
                self.pub.stream(*value)
            else:
                self.pub.display(self._iteration_bundle(value), display_id=self._id(value))
        for index in sorted(dirty):
            self.pub.display(self._iteration_bundle(index), display_id=self._id(index), update=True)


class WidgetLive(_Live):
    """The ipywidgets card, for frontends that render widgets."""

    def __init__(self, pub: Publisher, view: TurnView, on_stop: Callable[[], None]) -> None:
        super().__init__(pub, view)
        self._on_stop = on_stop
        self.card: Any = None

    def flush(self) -> None:
        if self.card is None:
            from fleet_kernel.kernel.widgets import TurnCard

            self.card = TurnCard(self.view, self._on_stop)
            self.card.sync()
            self.pub.display(self.card.bundle())
            return
        self.card.sync()

    def close(self) -> None:
        super().close()
        if self.card is not None:
            self.card.close()


async def finish_turn(
    pub: Publisher, store: Store, view: TurnView, execution_count: int, *, text_mode: bool
) -> dict[str, Any] | None:
    """Replace the live view with the record: images, then one ``execute_result``; returns the error, if any."""
    from fleet_kernel.errors import NotFoundError

    if not text_mode:
        pub.clear()
    for art in inline_images(view):
        try:
            blob = await store.get_blob(art["sha256"])
        except NotFoundError:
            continue
        pub.display(*image_bundle(art["path"], art["mime"], blob))
    data, metadata = transcript_bundle(view)
    if text_mode:  # the terminal already printed the transcript and its summary line by line
        outcome = view.answer if view.status == "completed" else view.outcome_text()
        data["text/plain"] = f"{outcome}\n"
    pub.send("execute_result", {"execution_count": execution_count, "data": data, "metadata": metadata})
    error = error_content(view)
    if error is not None:
        pub.send("error", error)
    return error


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
