"""Turning a turn's events into IOPub messages, throttled, for three kinds of frontend.

- ``WidgetLive`` (JupyterLab and other widget frontends): one ipywidgets card per turn, updated in place.
- ``PlainLive`` (nbclient, nbconvert, frontends without widgets): a status ``display_data`` updated by
  ``update_display_data``, one display per iteration (reasoning and code), and the code's output as
  ``stream`` messages while it prints.
- ``TextLive`` (``jupyter console``, ``%fleet output text``): everything as readable ``stream`` lines, as
  ``render_text.TextStream`` says it (the one text renderer, which the transcript's ``text/plain`` is too).

All three fold events into a ``TurnView`` (the one fold, ``fleet_kernel.view``) and render what changed
in it, never the events themselves. They flush at most every ``FLUSH_INTERVAL_S`` (``TOKEN_FLUSH_S`` while
the model's tokens stream in; the first event goes out at once, the last state always goes out), so a chatty
turn stays well under
JupyterLab's IOPub rate limit. ``finish_turn`` then replaces the live view with the turn's record:
artifact images and one ``execute_result`` carrying the transcript; a widget frontend then gets the
feedback bar under a completed turn's answer (its fallback text says how to mark it with ``%fleet feedback``).
"""

from __future__ import annotations

import asyncio
import html
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet_kernel.errors import NotFoundError
from fleet_kernel.events import Event
from fleet_kernel.markdown import NO_MATH, md_block
from fleet_kernel.render import head_html, iteration_note, status_line
from fleet_kernel.render_text import TextStream, iteration_head_text, outcome_text
from fleet_kernel.transcript import error_content, image_bundle, inline_images, transcript_bundle
from fleet_kernel.view import IterationView, TurnView

if TYPE_CHECKING:
    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.kernel.commands import Reply
    from fleet_kernel.kernel.context import KernelContext
    from fleet_kernel.store import Store

FLUSH_INTERVAL_S = 0.25
TOKEN_FLUSH_S = 0.1  # streamed tokens (lm.delta) show within ~0.1 s: 10 updates a second while they arrive
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
        self._due = 0.0  # when the pending flush runs
        self._ticker: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def begin(self) -> None:
        """Show the turn at once, before the engine has even claimed it; its first event also goes out at once."""
        self.flush()

    def on_event(self, event: Event) -> None:
        self.record(self.view.apply(event))
        self._schedule(TOKEN_FLUSH_S if event.type == "lm.delta" else FLUSH_INTERVAL_S)

    def record(self, touched: IterationView | None) -> None:
        """Note what changed in the view, in the iteration ``touched`` or the turn (subclasses); sending
        happens in ``flush``."""

    def flush(self) -> None:
        """Send everything noted since the last flush (subclasses)."""

    def _schedule(self, interval: float = FLUSH_INTERVAL_S) -> None:
        due = max(self._last_flush + interval, time.monotonic())
        if self._pending is not None:
            if self._due <= due:
                return
            self._pending.cancel()  # tokens arrived: flush sooner than planned
        self._due = due
        self._pending = self._loop.call_later(due - time.monotonic(), self._flush_now)

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
        self._text = TextStream(view)

    def record(self, touched: IterationView | None) -> None:
        self._text.record(touched)

    def flush(self) -> None:
        for name, text in self._text.take():
            self.pub.stream(name, text)


class PlainLive(_Live):
    """Plain displays and streams: live in any frontend, and the final state is what nbclient saves."""

    def __init__(self, pub: Publisher, view: TurnView) -> None:
        super().__init__(pub, view)
        self._ops: list[tuple[str, Any]] = []
        self._dirty: set[int] = set()
        self._shown: dict[int, str] = {}
        self._heads: dict[int, tuple[Any, ...]] = {}
        self._streamed: dict[int, int] = {}
        self._status_shown = False
        self._live_chars = 0
        self._prefix = f"fleet-{uuid.uuid4().hex[:16]}"  # fresh per run: never reuse a display id

    def _id(self, index: int) -> str:
        return f"{self._prefix}-{index}"

    def record(self, touched: IterationView | None) -> None:
        if touched is None:
            return
        its = self.view.iterations
        index = next(i for i in range(len(its) - 1, -1, -1) if its[i] is touched)
        thought = len(touched.live_thinking) + len(touched.thinking)
        head = (touched.shown_reasoning, touched.shown_code, thought, touched.duration_ms, touched.error)
        if head != self._heads.get(index, ("", "", 0, None, None)):
            self._heads[index] = head
            if index not in self._shown:
                self._shown[index] = self._id(index)
                self._ops.append(("display", index))
            elif ("display", index) not in self._ops:
                self._dirty.add(index)
        for stream, text in touched.chunks[self._streamed.get(index, 0) :]:
            self._stream(stream, text)
        self._streamed[index] = len(touched.chunks)

    def _stream(self, stream: str, text: str) -> None:
        room = MAX_LIVE_OUTPUT_CHARS - self._live_chars
        if room <= 0:
            return
        if len(text) > room:
            text = text[:room] + "\n... (more output: the transcript and the store keep it)\n"
        self._live_chars += len(text)
        if self._ops and self._ops[-1][0] == "stream" and self._ops[-1][1][0] == stream:
            self._ops[-1] = ("stream", (stream, self._ops[-1][1][1] + text))
        else:
            self._ops.append(("stream", (stream, text)))

    def _iteration_bundle(self, index: int) -> dict[str, str]:
        it = self.view.iterations[index]
        note = iteration_note(it)
        text = iteration_head_text(it)
        body = (
            f'<div class="{NO_MATH}"><b>{html.escape(it.label)}</b>{html.escape(note)}{head_html(it, live=True)}</div>'
        )
        return {"text/plain": text, "text/html": body}

    def _status_bundle(self) -> dict[str, str]:
        line = status_line(self.view, self.started)
        return {
            "text/plain": f"Fleet · {line}",
            "text/html": f'<p class="{NO_MATH}"><b>Fleet</b> · {html.escape(line)}</p>',
        }

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

    def __init__(self, pub: Publisher, view: TurnView, on_stop: Callable[[], object] | None) -> None:
        super().__init__(pub, view)
        self._on_stop = on_stop
        self.card: Any = None

    def flush(self) -> None:
        if self.card is None:
            from fleet_kernel.kernel.widgets import TurnCard  # widgets load ipywidgets (~0.3 s)

            self.card = TurnCard(self.view, self._on_stop)
            self.card.sync()
            self.pub.display(self.card.bundle())
            return
        self.card.sync()

    def close(self) -> None:
        super().close()
        if self.card is not None:
            self.card.close()


async def run_and_show(
    ctx: KernelContext,
    pub: Publisher,
    task: str,
    cancel: CancelToken,
    execution_count: int,
    *,
    report_error: bool = True,
    stop_button: bool = True,
    **start: Any,
) -> tuple[TurnView, dict[str, Any] | None]:
    """Run one turn of ``ctx``'s session and show it live in ``ctx``'s mode, then its record.

    The one way a cell becomes a turn, for the ``fleet`` kernel and the ``%%fleet`` magic alike.
    ``cancel`` stops the turn (at once if it is cancelled while the turn starts); ``start`` goes to
    ``TurnRunner.start``; ``stop_button`` false leaves the widget card without one. Returns the folded
    view and the error content of a failed or cancelled turn.
    """
    view, mode = TurnView(), ctx.live_mode()
    if mode == "widgets":
        stop = (lambda: cancel.cancel("stopped from the notebook")) if stop_button else None
        live: _Live = WidgetLive(pub, view, stop)
    else:
        live = (TextLive if mode == "text" else PlainLive)(pub, view)
    live.begin()
    try:
        handle = await ctx.start_turn(task, **start)
        runner = await ctx.open()  # opened by start_turn already
    except BaseException:
        live.close()
        if mode != "text":
            pub.clear()  # the error output that follows replaces the "starting" view
        raise
    cancel.on_cancel(lambda: handle.cancel(cancel.reason or "interrupted"))
    try:
        async for event in handle.events():
            live.on_event(event)
        await live.finish()
    finally:
        live.close()
    error = await finish_turn(
        pub, runner.store, view, execution_count, text_mode=mode == "text", report_error=report_error
    )
    if mode == "widgets" and view.status == "completed":
        show_feedback_bar(ctx, pub, handle.turn.session_id, view.turn_id)
    return view, error


def show_feedback_bar(ctx: KernelContext, pub: Publisher, session_id: str, turn_id: str) -> None:
    """The 👍/👎 bar under a completed turn's answer. A click, on whichever thread it arrives, marks the
    turn through ``evals.feedback.mark`` on this loop (the kernel's, or the magic's own thread's)."""
    from fleet_kernel.kernel.context import load_off_loop  # context imports display: a cycle
    from fleet_kernel.kernel.widgets import FeedbackBar  # widgets load ipywidgets (~0.3 s)

    loop = asyncio.get_running_loop()

    async def record(rating: str, note: str) -> object:
        await load_off_loop("fleet_kernel.evals.feedback")
        from fleet_kernel.evals.feedback import mark  # the evaluation package loads with the first mark

        return await mark(await ctx.opened_store(), session_id, turn_id, rating, note)

    bar = FeedbackBar(turn_id, lambda rating, note: asyncio.run_coroutine_threadsafe(record(rating, note), loop))
    pub.display(bar.bundle())


class ProgressLine:
    """One line a long command updates in place while it runs (``%fleet eval``'s runs done): a display
    updated by ``update_display_data``, or a line each time in a terminal, which ignores display updates."""

    def __init__(self, pub: Publisher, *, text_mode: bool) -> None:
        self.pub, self.text_mode = pub, text_mode
        self._id = f"fleet-progress-{uuid.uuid4().hex[:16]}"  # fresh per command: never reuse a display id
        self._shown = False

    def __call__(self, line: str) -> None:
        if self.text_mode:
            self.pub.stream("stdout", line + "\n")
            return
        data = {"text/plain": line, "text/html": f'<p class="{NO_MATH}">{html.escape(line)}</p>'}
        self.pub.display(data, display_id=self._id, update=self._shown)
        self._shown = True


def show_reply(pub: Publisher, reply: Reply, *, text_mode: bool) -> None:
    """A ``%fleet`` command's reply: a text stream in a terminal, else a display with Markdown."""
    if text_mode:
        pub.stream("stdout", reply.text.rstrip("\n") + "\n")
        return
    data = {"text/plain": reply.text}
    if reply.markdown:
        data["text/markdown"] = md_block(reply.markdown)
    pub.display(data)


async def finish_turn(
    pub: Publisher, store: Store, view: TurnView, execution_count: int, *, text_mode: bool, report_error: bool = True
) -> dict[str, Any] | None:
    """Replace the live view with the record: images, then one ``execute_result``; returns the error, if any
    (sent as an ``error`` message unless ``report_error`` is false: the caller raises it its own way)."""
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
        data["text/plain"] = outcome_text(view)
    pub.send("execute_result", {"execution_count": execution_count, "data": data, "metadata": metadata})
    error = error_content(view)
    if error is not None and report_error:
        pub.send("error", error)
    return error
