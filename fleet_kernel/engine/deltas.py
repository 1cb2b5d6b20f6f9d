"""The reply text of a streamed LM call, told apart by field and coalesced into ``lm.delta`` events.

dspy's ChatAdapter asks the model for ``[[ ## reasoning ## ]]`` and ``[[ ## code ## ]]`` sections (then
``[[ ## completed ## ]]``). ``FieldSplitter`` reads the reply as it streams and says which field each piece
belongs to, holding back only what could still turn out to be a header, the whitespace the parser strips
and (in code) the Markdown fence ``strip_code`` removes: so the pieces of a field, joined, are the text the
step's own ``reasoning`` / ``code`` event carries, in the usual cases. ``DeltaCoalescer`` turns the pieces
into events: a piece waits at most ``FLUSH_S`` or until ``FLUSH_CHARS`` have gathered, so a call keeps a
bounded number of rows in the store (at most one per 50 ms plus one per 256 characters, not one per token).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable

STREAMED_FIELDS = ("reasoning", "code")
FLUSH_S = 0.05
FLUSH_CHARS = 256

log = logging.getLogger(__name__)

_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")  # as dspy's ChatAdapter matches it, at the start of a line
_OPENING = "[[ ## "
_CLOSING = " ## ]]"


def _may_be_header(text: str) -> bool:
    """Whether a line starting with ``text`` (its start stripped) could still become a field header."""
    if len(text) <= len(_OPENING):
        return _OPENING.startswith(text)
    if not text.startswith(_OPENING):
        return False
    rest = text[len(_OPENING) :]
    tail = re.sub(r"^\w*", "", rest)  # after the field's name
    return (len(tail) < len(rest) or not tail) and _CLOSING.startswith(tail)


class _Stripped:
    """One field's text as ``str.strip`` would leave it, told piece by piece: leading whitespace is dropped,
    trailing whitespace waits until more text follows it."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        body = text.rstrip()
        if not body:
            self.held += text
            return ""
        out = self.held + body
        self.held = text[len(body) :]
        return out


class _Unfenced:
    """Code as ``strip_code`` leaves it: an opening Markdown fence line is dropped, and the block ends at the
    closing fence. Backticks at the end of a piece wait until it is clear whether they start a fence."""

    def __init__(self) -> None:
        self.state = "start"  # start -> (lang ->) body -> done
        self.fenced = False
        self.held = ""

    def feed(self, text: str) -> str:
        text, self.held = self.held + text, ""
        out = ""
        while text:
            if self.state == "start":
                stripped = text.lstrip()
                if not stripped:
                    return out
                if len(stripped) < 3 and "```".startswith(stripped):
                    self.held = text
                    return out
                if stripped.startswith("```"):
                    self.state, self.fenced, text = "lang", True, stripped[3:]
                else:
                    self.state = "body"
            elif self.state == "lang":
                _, newline, text = text.partition("\n")
                if not newline:
                    return out
                self.state = "body"
            elif self.state == "body":
                end = text.find("```") if self.fenced else -1
                if end >= 0:
                    self.state = "done"
                    return out + text[:end]
                keep = len(text) - len(text.rstrip("`")) if self.fenced else 0
                self.held = text[len(text) - keep :] if keep else ""
                return out + text[: len(text) - keep]
            else:
                return out
        return out


class FieldSplitter:
    """Splits a streamed ChatAdapter reply into ``(field, text)`` pieces of the streamed fields."""

    def __init__(self, fields: tuple[str, ...] = STREAMED_FIELDS) -> None:
        self.fields = fields
        self.field: str | None = None  # the section being read
        self.seen: set[str] = set()  # the parser keeps a field's first section only
        self.line = ""  # the start of the current line, while it may still be a header
        self.in_line = False  # part of the current line was given out as text: it is no header
        self._strip: _Stripped | None = None
        self._fence: _Unfenced | None = None

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while text:
            if self.in_line:
                piece, newline, text = text.partition("\n")
                self._text(piece + newline, out)
                self.in_line = not newline
                continue
            self.line += text
            text = ""
            while True:
                candidate = self.line.lstrip()
                header = _HEADER.match(candidate)
                if header is not None:
                    self._begin(header.group(1))
                    self.line = candidate[header.end() :]
                    continue
                if "\n" in self.line:  # a whole line that is no header: text
                    first, _, self.line = self.line.partition("\n")
                    self._text(first + "\n", out)
                    continue
                if _may_be_header(candidate):
                    break  # wait: this line may still be a header
                text, self.line = self.line, ""
                self.in_line = True
                break
        return out

    def _begin(self, name: str) -> None:
        self.field = name if name in self.fields and name not in self.seen else None
        self.seen.add(name)
        self._strip = _Stripped()
        self._fence = _Unfenced() if name == "code" else None

    def _text(self, text: str, out: list[tuple[str, str]]) -> None:
        if self.field is None or self._strip is None or not text:
            return
        if self._fence is not None:
            text = self._fence.feed(text)
        piece = self._strip.feed(text)
        if piece:
            if out and out[-1][0] == self.field:
                out[-1] = (self.field, out[-1][1] + piece)
            else:
                out.append((self.field, piece))


class _Timers:
    """One thread that runs every coalescer's due flush. A ``threading.Timer`` each was a thread started
    (~150 us of CPU) for every 50 ms of a streamed reply: more than reading its chunks, and one thread per
    reply streaming at once."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, call: Callable[[], None]) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), call))
            if self._thread is None or not self._thread.is_alive():  # first use, or a child after fork
                self._thread = threading.Thread(target=self._run, name="fleet-delta-timers", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, call = heapq.heappop(self._due)
            try:
                call()
            except Exception:  # a flush's own failure is its turn's; the other replies' timers go on
                log.exception("a streamed reply's timed flush failed")


_TIMERS = _Timers()


class DeltaCoalescer:
    """Gathers the pieces of one call and hands them to ``flush(field, text)`` in few, timely parts.

    A piece goes out at once when nothing went out for ``FLUSH_S``; otherwise it waits for the next one,
    ``FLUSH_CHARS`` gathered, a change of field, ``close``, or a timer ``FLUSH_S`` after the last part.
    ``hold(text)`` says how many characters at the end of a part must wait for more (the start of a secret
    that the next piece may complete, so no part shows a key half). Thread-safe.
    """

    def __init__(
        self,
        flush: Callable[[str, str], None],
        *,
        hold: Callable[[str], int] = lambda _text: 0,
        interval_s: float = FLUSH_S,
        max_chars: int = FLUSH_CHARS,
    ) -> None:
        self._flush = flush
        self._hold = hold
        self.interval_s = interval_s
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._field: str | None = None
        self._text = ""
        self._last = float("-inf")
        self._timer_set = False  # a flush is due on ``_TIMERS``
        self.closed = False
        self.parts = 0

    def add(self, field: str, text: str) -> None:
        with self._lock:
            if self.closed:
                return
            if self._field is not None and field != self._field:
                self._send(final=True)
            self._field = field
            self._text += text
            due = time.monotonic() - self._last >= self.interval_s or len(self._text) >= self.max_chars
            if due:
                self._send(final=False)
            if self._text and not self._timer_set:
                self._timer_set = True
                _TIMERS.call_later(self.interval_s, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer_set = False
            if not self.closed:
                self._send(final=False)

    def _send(self, *, final: bool) -> None:
        """Hand over what is gathered (under the lock); all of it when ``final``."""
        field, text = self._field, self._text
        keep = 0 if final else min(self._hold(text), len(text))
        part = text[: len(text) - keep]
        self._text = text[len(text) - keep :]
        if field is not None and part:
            self._last = time.monotonic()
            self.parts += 1
            self._flush(field, part)

    def close(self) -> None:
        """Hand over the rest and stop: the call ended (or was cut short)."""
        with self._lock:
            if self.closed:
                return
            self._send(final=True)
            self.closed = True  # a flush still due finds it closed
