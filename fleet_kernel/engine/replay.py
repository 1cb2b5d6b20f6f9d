"""Record a model's exchanges to a cassette, and replay them offline.

``FLEET_LM_RECORD=<file>`` wraps the configured model: each request and its answer are appended to the
cassette (a JSON file). ``FLEET_LM_MODEL=replay/<file>`` answers from the cassette without any network:
a request is matched exactly, else on its inputs with digit runs ignored (the system prompt, file sizes
and timings change between machines); a request the cassette does not hold is a clear error naming the nearest
recorded one. Both are dspy custom engines (``complete(Request) -> Response``), so dspy's adapters,
callbacks and history work unchanged (recording and replay patch nothing in dspy; see ``litellm_stream``
for the one place Fleet stands in for a dspy function).

A turn's calls stream (``streaming.py``): recording keeps when each piece of a streamed reply arrived
(``response.stream``: ``[seconds since the previous piece, characters]``), and a replay streams the reply
in those pieces, at the recorded pace (each pause at most ``MAX_PAUSE_S``) or at once (``[lm] replay_pace``).
A reply recorded whole replays in pieces of ``PIECE_CHARS``, at once.

An exchange also keeps what the request asked for (``request``: ``max_tokens``, ``temperature``, the tools
offered, whether it streamed) and why the reply ended (``response.finish_reason``, beside ``usage``), so a
replay ends each reply as the live call did: a reply cut at the token cap replays as cut (``length``), and
the turn says so as it did live. Cassettes recorded before these keys replay as ``stop``.
"""

from __future__ import annotations

import difflib
import threading
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import dspy
from dspy.lm15 import Message, Request, Response, StreamDeltaEvent, TextPart, Usage, response_to_events

from fleet_kernel.cassette import FINISH_REASONS, Cassette, exact_key, loose_key
from fleet_kernel.engine.metered import MeteredLM
from fleet_kernel.engine.streaming import CallStream, StreamSink, current, read_as_stream, streaming
from fleet_kernel.errors import LMError

MAX_PAUSE_S = 0.5  # the longest pause a paced replay makes between two pieces
PIECE_CHARS = 16  # the pieces a reply recorded whole is streamed in
_last_cost = threading.local()


def request_messages(request: Request) -> list[dict[str, str]]:
    """The request as plain ``{role, content}`` messages: what a cassette keys on."""
    messages = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
        messages.append({"role": "system", "content": system})
    messages += [{"role": m.role, "content": m.text or ""} for m in request.messages]
    return messages


def request_params(request: Request, *, stream: bool) -> dict[str, Any]:
    """What a request asked for beyond its messages: kept with the exchange, not matched on."""
    config = request.config
    return {
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "tools": [tool.name for tool in request.tools],
        "stream": stream,
    }


def _response(text: str, usage: dict[str, int], model: str, finish: str | None = None) -> Response:
    return Response(
        id=None,
        model=model,
        message=Message.assistant([TextPart(text)]),
        finish_reason=finish if finish in FINISH_REASONS else "stop",
        usage=Usage(
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            total_tokens=int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0)),
        ),
    )


class ReplayEngine:
    """Answers requests from a cassette; the same request asked again gets its next recorded answer."""

    def __init__(self, cassette: Cassette, *, paced: bool = True) -> None:
        self.cassette = cassette
        self.paced = paced
        self._lock = threading.Lock()
        self._by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._by_loose: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._served: dict[int, int] = defaultdict(int)
        for entry in cassette.exchanges:
            self._by_key[entry["key"]].append(entry)
            self._by_loose[entry["loose"]].append(entry)

    def _pick(self, candidates: list[dict[str, Any]]) -> dict[str, Any]:
        """The first entry not served yet, else the last one again (a cache answers twice alike)."""
        for entry in candidates:
            if not self._served[id(entry)]:
                self._served[id(entry)] += 1
                return entry
        return candidates[-1]

    def _entry(self, request: Request) -> dict[str, Any]:
        messages = request_messages(request)
        with self._lock:
            candidates = self._by_key.get(exact_key(messages)) or self._by_loose.get(loose_key(messages))
            if not candidates:
                raise LMError(self._miss_message(messages), code="lm_replay_miss")
            return self._pick(candidates)

    def _answer(self, entry: dict[str, Any]) -> Response:
        answer = entry["response"]
        _last_cost.value = None  # replaying costs nothing
        model = self.cassette.data.get("model") or "replay"
        return _response(answer["text"], answer.get("usage") or {}, model, answer.get("finish_reason"))

    def complete(self, request: Request) -> Response:
        """The recorded answer; streamed to a turn's call that listens (see the module doc)."""
        return read_as_stream(request, self.stream, lambda r: self._answer(self._entry(r)))

    def _miss_message(self, messages: list[dict[str, str]]) -> str:
        text = "\n".join(m["content"] for m in messages)
        best, best_number, best_ratio = None, 0, 0.0
        for number, entry in enumerate(self.cassette.exchanges, 1):
            other = "\n".join(m["content"] for m in entry["messages"])
            ratio = difflib.SequenceMatcher(None, text[-4000:], other[-4000:], autojunk=False).quick_ratio()
            if ratio > best_ratio:
                best, best_number, best_ratio = other, number, ratio
        hint = ""
        if best is not None:  # where, and this request's own line: the recorded prompts stay in the file
            for line, (ours, theirs) in enumerate(zip(text.splitlines(), best.splitlines(), strict=False), 1):
                if ours != theirs:
                    where = f"exchange {best_number}, line {line}"
                    hint = f"; the nearest recorded request differs ({where}) at: {ours[:160]!r}"
                    break
        return (
            f"the replay cassette {self.cassette.path} has no answer for this request{hint}. Replays only answer "
            "what was recorded: run the same notebook, or record again with FLEET_LM_RECORD and a real FLEET_LM_MODEL"
        )

    def stream(self, request: Request) -> Generator[Any, None, None]:
        """The recorded answer as stream events: its text in the recorded pieces (and pace)."""
        entry = self._entry(request)
        recorded = entry["response"].get("stream") or []
        for event in response_to_events(self._answer(entry)):
            if event.type != "delta" or event.delta.type != "text":
                yield event
                continue
            text, at = event.delta.text, 0
            pieces = [(float(pause), int(size)) for pause, size in recorded] or [
                (0.0, PIECE_CHARS) for _ in range(0, len(text), PIECE_CHARS)
            ]
            for pause, size in pieces:
                if self.paced and pause > 0:
                    time.sleep(min(pause, MAX_PAUSE_S))
                if at < len(text):
                    yield StreamDeltaEvent(delta=type(event.delta)(text=text[at : at + size]))
                at += size
            if at < len(text):  # the recorded pieces fell short of the text: the rest at once
                yield StreamDeltaEvent(delta=type(event.delta)(text=text[at:]))

    def close(self) -> None:
        pass


class _Timed:
    """A sink that notes when each piece of the reply text arrived, and passes it on."""

    def __init__(self, inner: StreamSink, pieces: list[list[float]]) -> None:
        self.inner = inner
        self.pieces = pieces
        self.last = time.perf_counter()

    def text(self, text: str) -> None:
        now = time.perf_counter()
        self.pieces.append([round(now - self.last, 4), len(text)])
        self.last = now
        self.inner.text(text)

    def thinking(self, text: str) -> None:
        self.inner.thinking(text)

    def close(self) -> None:
        self.inner.close()


class RecordingEngine:
    """Sends each request through the real LM and appends the exchange to the cassette."""

    def __init__(self, inner: dspy.LM, cassette: Cassette) -> None:
        self.inner = inner
        self.cassette = cassette

    def complete(self, request: Request) -> Response:
        pieces: list[list[float]] = []
        listening = current()
        with dspy.context(callbacks=[]):  # the outer LM reports this call; the inner one must not again
            if listening is None:
                response = self.inner(request)
            else:  # the inner LM streams to the turn's call; note the pace of its pieces on the way

                def open_timed() -> StreamSink:
                    pieces.clear()  # a retried attempt's pieces replace the last one's
                    return _Timed(listening.open(), pieces)

                timed = CallStream(open_timed, listening.check, listening.stopped, listening.live)
                with streaming(timed):
                    response = self.inner(request)
        entry = self.inner.history[-1] if self.inner.history else {}
        cost = entry.get("cost")
        usage = {"input_tokens": response.usage.input_tokens or 0, "output_tokens": response.usage.output_tokens or 0}
        params = request_params(request, stream=listening is not None)
        finish = str(getattr(response.finish_reason, "value", response.finish_reason) or "") or None
        self.cassette.append(
            request_messages(request),
            response.text or "",
            usage,
            cost,
            pieces or None,
            params=params,
            finish_reason=finish,
        )
        _last_cost.value = cost
        return response

    def stream(self, request: Request) -> Any:
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class CassetteLM(MeteredLM):
    """The LM a turn sees while recording or replaying; reports the real call's cost when there is one."""

    def update_history(self, entry: dict[str, Any]) -> None:
        entry["cost"] = getattr(_last_cost, "value", None)
        super().update_history(entry)


def replay_lm(path: str | Path, *, trusted: bool = True, paced: bool = True) -> dspy.LM:
    """An LM answering from the cassette at ``path`` (``FLEET_LM_MODEL=replay/<path>``); ``trusted``: the
    operator chose it (see ``Cassette.load``); ``paced``: streamed replies keep their recorded pace.

    Raises:
        LMError: the cassette is missing or invalid.
    """
    cassette = Cassette.load(path, trusted=trusted)
    engine = ReplayEngine(cassette, paced=paced)
    return CassetteLM(f"replay/{cassette.path.name}", engine=engine, cache=False, num_retries=0)


def recording(lm: dspy.LM, path: str | Path) -> dspy.LM:
    """``lm``, recording every exchange into the cassette at ``path`` (``FLEET_LM_RECORD``)."""
    cassette = Cassette.open_for_recording(path, lm.model)
    return CassetteLM(lm.model, engine=RecordingEngine(lm, cassette), cache=False, num_retries=0)
