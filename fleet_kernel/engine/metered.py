"""``MeteredLM``: a plain ``dspy.LM`` that also remembers, per thread, the usage, cost and finish reason of
the call it just finished, so the engine's LM callback can report them in ``lm.finished``.

Within a turn it asks the turn's ``TurnBudget`` before each call, reports each call's usage to it, never
asks for more than its ``max_tokens`` cap, and can close its requests in flight when the turn stops. A
turn's calls stream (``streaming.py``): their tokens go to the watcher as they arrive, and the budget
can stop a call between two of them.
Below ``lm`` (which builds the turn's models) and ``replay`` (whose cassette LM is one), so neither
imports the other to share it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import dspy
from dspy.clients.legacy_outputs import value  # reads objects and dicts alike
from dspy.utils.callback import BaseCallback

from fleet_kernel.engine import litellm_stream
from fleet_kernel.engine.streaming import CallStream, StreamingEngines, StreamSink, streaming

if TYPE_CHECKING:
    from fleet_kernel.engine.budget import TurnBudget

log = logging.getLogger(__name__)

TOKEN_KEYS = ("max_tokens", "max_completion_tokens")  # the names a reply's token cap goes by

_last_call = threading.local()
_call_ids = itertools.count(1)


def reported(
    call: Callable[[], Any],
    call_id: str,
    on_start: Callable[..., None],
    on_end: Callable[..., None],
    instance: Any,
    inputs: dict[str, Any],
) -> Any:
    """``call()`` between a callback's start and end handlers, as dspy's callback wrapper runs them, for
    Fleet's own LMs and predictors that tell their ``watcher`` without it."""
    on_start(call_id, instance, inputs)
    try:
        result = call()
    except BaseException as exc:
        on_end(call_id, None, exc)
        raise
    on_end(call_id, result, None)
    return result


RETRY_BASE_S = 0.5  # the first retry's wait; each next one doubles it
RETRY_MAX_S = 8.0  # the longest wait between two attempts (a provider's Retry-After: at most RETRY_AFTER_MAX_S)
RETRY_AFTER_MAX_S = 30.0
TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
TRANSIENT_CODES = frozenset({"rate_limit", "timeout", "transport", "overloaded", "server", "unavailable"})
TRANSIENT_NAMES = frozenset(
    {
        "RateLimitError",
        "ServiceUnavailableError",
        "InternalServerError",
        "APIConnectionError",
        "Timeout",
        "APITimeoutError",
        "BadGatewayError",
    }
)


def transient(exc: BaseException) -> bool:
    """A provider error worth sending the request again for: rate limited, overloaded, a 5xx, a timeout or a
    dropped connection. A stopped turn, a refused key or a bad request is not."""
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in TRANSIENT_STATUS
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code in TRANSIENT_CODES:
        return True
    return type(exc).__name__ in TRANSIENT_NAMES


def backoff_s(attempt: int, exc: BaseException | None = None) -> float:
    """How long to wait before retry ``attempt`` (1, 2, ...): the provider's Retry-After when it sends one,
    else exponential from ``RETRY_BASE_S`` with jitter, at most ``RETRY_MAX_S``."""
    after = getattr(exc, "retry_after", None)
    if isinstance(after, int | float) and after > 0:
        return min(float(after), RETRY_AFTER_MAX_S)
    wait: float = RETRY_BASE_S * 2.0 ** (attempt - 1)
    return min(wait, RETRY_MAX_S) * random.uniform(0.5, 1.0)  # noqa: S311 - backoff jitter, not a secret


STOPPED = "stopped"
"""The finish reason of a streamed call Fleet closed (the turn stopped, or its token budget ran out)."""


class LastCall(NamedTuple):
    """What the engine reports of an LM call in ``lm.finished``."""

    usage: dict[str, Any]
    cost: float | None
    finish_reason: str | None
    thinking: str | None = None  # the provider's own reasoning text (``reasoning_content``), when it sends one


NO_CALL = LastCall({}, None, None)


def take_last_call() -> LastCall:
    """Usage, cost and finish reason of the last LM call finished on this thread (then forgotten)."""
    last: LastCall = getattr(_last_call, "value", NO_CALL)
    _last_call.value = NO_CALL
    return last


def finish_reason(response: Any) -> str | None:
    """Why a reply ended: dspy's native ``Response`` (or a tuple of them) or a chat completion's first choice."""
    if isinstance(response, list | tuple):
        response = response[0] if response else None
    reason = value(response, "finish_reason", None)
    if reason is None:
        choices = value(response, "choices", None) or []
        reason = value(choices[0], "finish_reason", None) if choices else None
    reason = getattr(reason, "value", reason)  # an enum
    return str(reason) if reason else None


def thinking_text(response: Any) -> str | None:
    """The provider's reasoning text (lm15 ``ThinkingPart``s; LiteLLM's ``reasoning_content``), or None."""
    if isinstance(response, list | tuple):
        response = response[0] if response else None
    message = value(response, "message", None)
    parts = value(message, "parts", None)
    if parts:
        texts = [str(value(part, "text", "") or "") for part in parts if value(part, "type", None) == "thinking"]
        return "".join(texts) or None
    choices = value(response, "choices", None) or []
    message = value(choices[0], "message", None) if choices else None
    text = value(message, "reasoning_content", None) if message is not None else None
    return str(text) if text else None


def _streamed(stream: CallStream, call: Callable[[], Any]) -> Any:
    with streaming(stream):
        return call()


class MeteredLM(dspy.LM):
    """``dspy.LM`` that hands each call's usage and cost to the engine (see ``take_last_call``).

    ``budget`` (set for a turn by ``TurnBudget.watch``) gates every call; copies share it.
    """

    budget: TurnBudget | None = None
    watcher: BaseCallback | None = None  # told of each call as a dspy callback would be, without dspy's wrapper
    stream_replies: bool = True  # a watched call streams its reply (``[lm] stream``)
    retries: int = 0  # times a request is sent again after a transient provider error (``[lm] num_retries``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._engine_store = StreamingEngines()  # copies share it, as they share dspy's plain one
        self._live_streams: set[Any] = set()  # LiteLLM streams being read (copies share it too)
        litellm_stream.install()  # calls through LiteLLM stream as well

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()
        state.pop("_live_streams", None)  # open connections: never copied
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._engine_store = StreamingEngines()
        self._live_streams = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for key in TOKEN_KEYS:  # model code may pass its own cap per call; never above ours
            cap = self.kwargs.get(key)
            if cap and kwargs.get(key) is not None:
                kwargs[key] = min(int(kwargs[key]), int(cap))
        attempt = 0
        while True:
            budget = self.budget
            if budget is not None:
                budget.check()  # every attempt, a retry too, passes the turn's gate
            try:
                result = self._watched(args, kwargs)
            except Exception as exc:
                if budget is not None:
                    budget.check()  # a call cut short because the turn stopped ends the turn, not just this call
                if attempt >= self.retries or not transient(exc):
                    raise
                attempt += 1
                delay = backoff_s(attempt, exc)
                log.info(
                    "LM request failed (%s), retry %d of %d in %.1f s", type(exc).__name__, attempt, self.retries, delay
                )
                if budget is not None:
                    budget.note_retry()
                    budget.cancel.wait(delay)  # a stop or the deadline ends the wait (and the turn)
                else:
                    time.sleep(delay)
                continue
            if budget is not None:
                budget.check()  # this call crossed a budget: the turn ends now, not at its next call
            return result

    def _watched(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call: Callable[[], Any] = functools.partial(super().__call__, *args, **kwargs)
        watcher = self.watcher
        if watcher is None:
            return call()
        call_id = f"lm-{next(_call_ids)}"
        open_sink: Callable[[str], StreamSink] | None = getattr(watcher, "lm_stream", None)
        if open_sink is not None and self.stream_replies:
            stream = CallStream(
                open=functools.partial(open_sink, call_id),
                check=self.budget.check_call if self.budget is not None else lambda _tokens: None,
                stopped=self._stopped,
                live=self._live_streams,
            )
            call = functools.partial(_streamed, stream, call)
        return reported(call, call_id, watcher.on_lm_start, watcher.on_lm_end, self, kwargs)

    def _stopped(self, usage: dict[str, int]) -> None:
        """A streamed call was closed before its end: meter what it used, as far as it is known."""
        _last_call.value = LastCall(dict(usage), None, STOPPED)
        if self.budget is not None:
            self.budget.add(usage, None)

    def update_history(self, entry: dict[str, Any]) -> None:
        """Meter the call, and keep it in this LM's own history only.

        dspy also appends every call to a process-wide list (10 000 entries, each a whole prompt and
        reply) and to each calling module's history: in a server or kernel that runs turn after turn,
        that kept the prompts of up to 10 000 past calls alive. A turn's LMs are dropped with the turn.
        """
        usage, cost = dict(entry.get("usage") or {}), entry.get("cost")
        response = entry.get("response")
        _last_call.value = LastCall(usage, cost, finish_reason(response), thinking_text(response))
        if self.budget is not None:
            self.budget.add(usage, cost)
        if dspy.settings.disable_history:
            return
        if len(self.history) >= max(1, dspy.settings.max_history_size):
            self.history.pop(0)
        self.history.append(entry)

    def abort(self) -> None:
        """Close this LM's requests in flight, so the model server sees the client leave, and its pools.

        dspy's native engine (lm15) waits for a reply in ``recv`` on a pooled socket; closing that socket
        from another thread would not wake it until the reply came, shutting it down ends the read (and the
        request) at once. The engine is closed too, so a retry cannot open a new connection. A stream read
        through LiteLLM is cut the same way (``litellm_stream.cut``).
        """
        for source in list(self._live_streams):
            litellm_stream.cut(source)
        with self._engine_lock:
            engines = list(self._engine_store.values())
        for engine in engines:
            pool = getattr(getattr(getattr(engine, "router", None), "_transport", None), "_pool", None)
            if pool is None:
                continue
            with pool._lock:
                connections = list(pool._in_use)
            for connection in connections:
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)
        self.close()
        inner = getattr(self.engine, "inner", None)  # while recording: the live LM behind the cassette
        if isinstance(inner, MeteredLM):
            inner.abort()
