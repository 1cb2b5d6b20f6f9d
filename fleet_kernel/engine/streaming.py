"""LM calls that stream: the reply's tokens reach the turn as they arrive, the call's result is unchanged.

dspy runs each call through its engine's ``complete(request)``. ``StreamingEngines`` is the engine store
of Fleet's LMs (``dspy.LM._engine_store``): each native engine dspy puts there gets a ``complete`` that
asks for the same request as a stream (``stream: true``; usage in the last chunk) and assembles the
reply with lm15's own ``StreamAccumulator``, so dspy's retries, pricing, history and parsing see the very
``Response`` a whole reply gives: the same text, usage, cost, finish reason and ``max_tokens``.

Only a call made for a turn streams (``streaming(CallStream)`` around it, set by ``MeteredLM``); its
tokens go to the ``CallStream``'s sink, which also decides whether the call may go on: a turn cancelled,
or a call whose estimated tokens would pass the turn's token budget, closes the stream at once. A provider
that cannot stream gets the whole-reply request, as before; one whose stream carries no usage is metered
by the same estimate the budget uses. Calls dspy sends through LiteLLM (providers its native engine does not
know) stream the same way, in ``litellm_stream.py``; ``StreamReader`` is what both paths share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
from collections.abc import Callable, Generator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from dspy.lm15 import Request, Response, UnsupportedFeatureError, Usage

CHARS_PER_TOKEN = 4  # the estimate of tokens not counted yet by the provider


class StreamSink(Protocol):
    """Where one attempt of a call streams to."""

    def text(self, text: str) -> None: ...

    def thinking(self, text: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class CallStream:
    """One LM call of a turn, as its stream is read.

    ``open`` gives the sink of each attempt (dspy retries a failed attempt); ``check(tokens)`` raises to
    stop the call, given the tokens it would have used so far (estimated: prompt plus streamed reply);
    ``stopped(usage)`` is told the estimated usage of a call cut short, which the provider never reports.
    """

    open: Callable[[], StreamSink]
    check: Callable[[int], None]
    stopped: Callable[[dict[str, int]], None]
    live: set[Any] = dataclasses.field(default_factory=set)
    """The LiteLLM streams being read for this call's LM, so that closing the LM cuts them (``abort``)."""


class StreamReader:
    """One attempt's stream as it is read: each piece goes to the attempt's sink, and the call is asked
    whether it may go on, given the tokens used so far (the prompt's estimate plus one per piece, or the
    pieces' characters over four when that is more). ``failed`` meters an attempt cut short."""

    def __init__(self, call: CallStream, prompt: int) -> None:
        self.call = call
        self.prompt = prompt
        self.sink = call.open()
        self.pieces = self.chars = 0

    @property
    def completion(self) -> int:
        return max(self.pieces, self.chars // CHARS_PER_TOKEN)

    def text(self, text: str) -> None:
        self._count(text)
        self.sink.text(text)
        self.call.check(self.prompt + self.completion)

    def thinking(self, text: str) -> None:
        self._count(text)
        self.sink.thinking(text)
        self.call.check(self.prompt + self.completion)

    def _count(self, text: str) -> None:
        self.pieces += 1
        self.chars += len(text)

    def failed(self, exc: BaseException) -> None:
        """The stream ended in ``exc``: meter what was sent (the provider will never say how much), and
        raise the turn's own reason when the turn stopped, so the call is not retried."""
        if self.pieces:
            self.call.stopped({"prompt_tokens": self.prompt, "completion_tokens": self.completion})
        if isinstance(exc, Exception):
            self.call.check(self.prompt + self.completion)

    def close(self) -> None:
        self.sink.close()

    def estimate(self) -> Usage:
        """The call's usage as the budget estimates it, for a stream that reports none."""
        total = self.prompt + self.completion
        return Usage(input_tokens=self.prompt, output_tokens=self.completion, total_tokens=total)


_current: ContextVar[CallStream | None] = ContextVar("fleet_call_stream", default=None)


@contextlib.contextmanager
def streaming(call: CallStream) -> Iterator[None]:
    """Stream the LM calls made inside (on this thread and in contexts copied from it) to ``call``."""
    token = _current.set(call)
    try:
        yield
    finally:
        _current.reset(token)


def prompt_tokens(request: Request) -> int:
    """The request's tokens as the provider will count them, roughly: its characters over four."""
    chars = 0
    system = request.system
    if isinstance(system, str):
        chars += len(system)
    elif system is not None:
        chars += sum(len(getattr(part, "text", "") or "") for part in system)
    chars += sum(len(message.text or "") for message in request.messages)
    return chars // CHARS_PER_TOKEN


def current() -> CallStream | None:
    """The turn's call listening to this one's tokens, if any."""
    return _current.get()


def streamed_complete(engine: Any, request: Request) -> Response:
    """``engine.complete(request)``, read as a stream when a turn's call is listening (see module doc)."""
    return read_as_stream(request, engine.stream, functools.partial(_whole, engine))


def read_as_stream(
    request: Request, stream: Callable[[Request], Generator[Any, None, None]], whole: Callable[[Request], Response]
) -> Response:
    """The reply to ``request``: ``whole(request)``, or, when a turn's call is listening, the events of
    ``stream(request)`` told to its sink as they come and assembled into the same ``Response``."""
    call = _current.get()
    if call is None:
        return whole(request)
    # the assembler dspy's own streaming uses; imported by name: its module's types would pull all of dspy
    # (which ships none) into the type check
    accumulate: Any = importlib.import_module("dspy._vendor.lm15.result").StreamAccumulator

    events = stream(request)
    try:
        first = next(events)
    except UnsupportedFeatureError:  # raised before any I/O: this provider only answers whole replies
        return whole(request)
    except StopIteration:
        first = None
    reader = StreamReader(call, prompt_tokens(request))
    accumulator = accumulate(request)
    try:
        with contextlib.closing(events):
            event = first
            while event is not None:
                accumulator.push(event)
                if event.type == "delta":
                    text = getattr(event.delta, "text", None)
                    if text and event.delta.type == "thinking":
                        reader.thinking(text)
                    elif text and event.delta.type == "text":
                        reader.text(text)
                event = next(events, None)
    except BaseException as exc:
        reader.failed(exc)
        raise
    finally:
        reader.close()
    response: Response = accumulator.response()
    usage = response.usage
    if usage is None or (not usage.input_tokens and not usage.output_tokens):
        # a provider that sends no usage in its stream: meter the call by estimate rather than as free
        response = dataclasses.replace(response, usage=reader.estimate())
    return response


def _whole(engine: Any, request: Request) -> Response:
    """The engine's own ``complete`` (the class's: the instance's is ``streamed_complete``)."""
    response: Response = type(engine).complete(engine, request)
    return response


class StreamingEngines(dict[Any, Any]):
    """A ``dspy.LM`` engine store whose native engines stream a turn's calls (``streamed_complete``).

    dspy puts each engine it builds here before its first call and reuses it; ``complete`` is replaced
    on that instance only (dspy's class and other LMs' engines are untouched).
    """

    def __setitem__(self, key: Any, engine: Any) -> None:
        from dspy.clients.engines import lm15_engine  # noqa: PLC0415 - dspy's native engine (untyped: imported here)

        if isinstance(engine, lm15_engine.LM15Engine):
            engine.complete = lambda request, _engine=engine: streamed_complete(_engine, request)
        super().__setitem__(key, engine)
