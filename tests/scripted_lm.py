"""A scripted OpenAI-compatible chat server on loopback: the LM every Fleet suite uses.

Root-model requests (dspy's ChatAdapter prompts) are answered from scripts of RLM steps; sub-LM
requests (plain prompts from ``llm_query``) from a function of the prompt (its text, or
``{"delay": s, "text": ...}`` for a slow answer). Scripts are chosen by a
key that appears in the request (the turn's task, say), so concurrent turns each get their own.

    with ScriptedLM({"*": [step("look", "print(1)"), step("done", "SUBMIT(answer='42')")]}) as lm:
        env = {"FLEET_LM_MODEL": "openai/scripted", "FLEET_LM_BASE_URL": lm.base_url, "FLEET_LM_API_KEY": "sk-test"}

A request with ``"stream": true`` is answered as the OpenAI chat.completions stream (server-sent
``chat.completion.chunk`` events of ``token_chars`` characters, ``token_delay_s`` apart, the last one with
the finish reason, then a usage chunk when ``stream_options.include_usage`` asks for it, then
``data: [DONE]``): the same text, finish reason and usage as the whole reply.

Run standalone for processes that need it: ``python tests/scripted_lm.py script.json`` prints the URL.
Stdlib only; ``TCP_NODELAY`` and one write per response (per chunk when streaming), so no Nagle delay.
"""

from __future__ import annotations

import base64
import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Step = dict[str, Any]


def step(reasoning: str, code: str) -> Step:
    """One RLM iteration: the model's reasoning and the code it writes."""
    return {"reasoning": reasoning, "code": code}


def chat_adapter_text(fields: dict[str, Any]) -> str:
    parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in fields.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def text_of(content: Any) -> str:
    """A message's text: its string, or the text parts of a multimodal content list."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``image_url`` parts of a request, each as ``{"mime", "bytes"}`` (decoded size of its data URL)."""
    found = []
    for message in body.get("messages") or []:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                head, _, data = url.partition(",")
                mime = head.removeprefix("data:").split(";")[0]
                found.append({"mime": mime, "bytes": len(base64.b64decode(data)) if data else 0})
    return found


def _echo(prompt: str) -> str:
    return f"sub-answer: {prompt[:200]}"


class ScriptedLM:
    """The server. ``scripts`` maps a key found in the request text to a FIFO of steps ("*" matches all).

    A step is ``{"reasoning", "code"}`` (RLM action), any other dict of output fields (rendered as
    ChatAdapter text, e.g. ``{"answer": ...}`` for the extract fallback), or a control step:
    ``{"status": 401, "error": "..."}`` answers an HTTP error; ``{"delay": s, ...}`` waits first;
    ``{"raw": text}`` answers ``text`` as it is, and ``"finish_reason"`` in a step replaces ``stop``;
    ``"reasoning_content"`` adds the provider's thinking text (and its ``reasoning_tokens``);
    ``"token_delay"`` paces this step's stream instead of ``token_delay_s``.
    When a script runs out, ``default`` (if set) is repeated, else the server answers HTTP 500.
    ``requests`` holds every request body; ``disconnects`` the bodies of requests whose client went
    away before their response was written (a delay ends early when that happens); ``asked`` when
    (``time.perf_counter()``) each step of a keyed script was taken, by key; ``first_token`` when the
    first chunk of each streamed reply was written, ``streamed`` how many chunks each wrote in all
    (fewer than it had when its client went away), and ``sent`` each streamed piece of reply text with
    the wall-clock time (``time.time()``) it was written, for latency measurements across processes.
    """

    def __init__(
        self,
        scripts: dict[str, list[Step]] | None = None,
        *,
        sub: Callable[[str], Any] = _echo,
        default: Step | None = None,
        delay_s: float = 0.0,
        token_chars: int = 4,
        token_delay_s: float = 0.0,
    ) -> None:
        self._options: dict[str, Any] = {
            "sub": sub, "default": default, "delay_s": delay_s, "token_chars": token_chars, "token_delay_s": token_delay_s
        }  # fmt: skip
        self._lock = threading.Lock()
        self.reset(scripts)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def reset(self, scripts: dict[str, list[Step]] | None = None) -> None:
        """Forget every script, request and setting a test made: a server shared by many tests (one per
        pytest worker) answers each test as a fresh one would."""
        with self._lock:
            self.scripts = {key: list(steps) for key, steps in (scripts or {}).items()}
            self.sub: Callable[[str], Any] = self._options["sub"]
            self.default: Step | None = self._options["default"]
            self.delay_s: float = self._options["delay_s"]
            self.token_chars: int = self._options["token_chars"]
            self.token_delay_s: float = self._options["token_delay_s"]
            self.stream_usage = True  # false: a server that sends no usage chunk, even when asked for one
            self.first_token: list[float] = []
            self.streamed: list[int] = []
            self.sent: list[tuple[float, str]] = []
            self.requests: list[dict[str, Any]] = []
            self.images: list[dict[str, Any]] = []
            self.disconnects: list[dict[str, Any]] = []
            self.headers: list[dict[str, str]] = []
            self.asked: dict[str, list[float]] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment that points Fleet at this server."""
        return {
            "FLEET_LM_MODEL": "openai/scripted",
            "FLEET_LM_BASE_URL": self.base_url,
            "FLEET_LM_API_KEY": "sk-scripted-test-key",
            **extra,
        }

    def add(self, key: str, steps: list[Step]) -> None:
        with self._lock:
            self.scripts.setdefault(key, []).extend(steps)

    def __enter__(self) -> ScriptedLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ScriptedLM:
        return self.__enter__()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def is_root(body: dict[str, Any]) -> bool:
        """Whether a request is the root model's (a dspy ChatAdapter prompt) rather than a sub-LM call:
        the one place that knows what dspy's prompts look like, so tests need not."""
        messages = body.get("messages") or []
        system = text_of(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""
        return "[[ ## " in system

    def root_requests(self) -> list[dict[str, Any]]:
        return [body for body in self.requests if self.is_root(body)]

    # ------------------------------------------------------------------ answering

    def _next_step(self, text: str) -> Step | None:
        with self._lock:
            keys = sorted((k for k in self.scripts if k != "*" and k in text), key=len, reverse=True)
            for key in [*keys, "*"]:
                steps = self.scripts.get(key)
                if steps:
                    step = steps.pop(0)
                    if key != "*":
                        self.asked.setdefault(key, []).append(time.perf_counter())
                        if not steps:
                            del self.scripts[key]  # a spent script no longer costs every request a search
                    return step
            return self.default

    def answer(self, body: dict[str, Any], wait: Callable[[float], None] = time.sleep) -> tuple[int, dict[str, Any]]:
        """The response to one request; ``wait`` sleeps for the delays (and may raise to abandon it)."""
        messages = body.get("messages") or []
        text = "\n".join(text_of(m.get("content")) for m in messages)
        root = self.is_root(body)
        with self._lock:
            self.requests.append(body)
            seen = [{"root": root, "request": len(self.requests) - 1, **image} for image in image_parts(body)]
            self.images.extend(seen)
        if self.delay_s:
            wait(self.delay_s)
        if self.is_root(body):
            found = self._next_step(text)
            if found is None:
                return 500, {"error": {"message": "scripted LM: no step left for this request", "type": "server_error"}}
            found = dict(found)
            if "delay" in found:
                wait(float(found.pop("delay")))
            if "status" in found:
                return int(found["status"]), {
                    "error": {"message": found.get("error", "scripted error"), "type": "error"}
                }
            finish_reason = found.pop("finish_reason", "stop")
            thinking = found.pop("reasoning_content", None)
            pace = found.pop("token_delay", None)
            content = found.pop("raw") if "raw" in found else chat_adapter_text(found)
        else:
            prompt = text_of(messages[-1].get("content")) if messages else ""
            if seen:  # the sub-model says what it was shown, so a test can read it in the answer
                shown = ", ".join(f"{image['mime']} {image['bytes']} bytes" for image in seen)
                prompt = f"[images: {shown}] {prompt}"
            finish_reason, thinking, pace = "stop", None, None
            content = self.sub(prompt)
            if isinstance(content, dict):  # {"delay": s, "text": ...}: a slow sub-LM answer
                wait(float(content.get("delay", 0)))
                content = str(content.get("text", ""))
        prompt_tokens = max(1, len(text) // 4)
        reasoning_tokens = len(thinking) // 4 if thinking else 0
        completion_tokens = max(1, len(content) // 4) + reasoning_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["reasoning_content"] = thinking
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        reply = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": usage,
        }
        if pace is not None:
            reply["token_delay"] = float(pace)  # taken off again before the reply is sent
        return 200, reply

    def chunks(self, reply: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
        """``reply`` (a whole chat completion) as the chunks of its stream: thinking, then the text in
        ``token_chars`` pieces, the finish reason, and the usage when asked for."""
        choice = reply["choices"][0]
        message = choice["message"]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": reply["id"],
                "object": "chat.completion.chunk",
                "created": reply["created"],
                "model": reply["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        size = max(1, self.token_chars)
        out = [chunk({"role": "assistant", "content": ""})]
        thinking = message.get("reasoning_content") or ""
        out += [chunk({"reasoning_content": thinking[i : i + size]}) for i in range(0, len(thinking), size)]
        content = message["content"]
        out += [chunk({"content": content[i : i + size]}) for i in range(0, len(content), size)]
        out.append(chunk({}, choice["finish_reason"]))
        if include_usage:
            out.append({**chunk({}), "choices": [], "usage": reply["usage"]})
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:  # noqa: C901 - builds the handler class: its methods count as this one function
        server = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                head = (
                    f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                self.wfile.write(head + body)

            def _stream(self, chunks: list[dict[str, Any]], pace: float) -> None:
                """Server-sent events, one HTTP chunk each, ``pace`` seconds apart (stopping when the client
                goes away)."""
                self.wfile.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                sent = 0
                try:
                    for number, chunk in enumerate([*chunks, None]):
                        if number and pace:
                            self._wait(pace)
                        data = (
                            b"data: [DONE]\n\n" if chunk is None else b"data: " + json.dumps(chunk).encode() + b"\n\n"
                        )
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) + (b"0\r\n\r\n" if chunk is None else b""))
                        content = ((chunk or {}).get("choices") or [{}])[0].get("delta", {}).get("content")
                        with server._lock:
                            if number == 1:
                                server.first_token.append(time.perf_counter())
                            if content:
                                server.sent.append((time.time(), content))
                        sent += 1
                finally:
                    with server._lock:
                        server.streamed.append(sent)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.headers.append(dict(self.headers))
                try:
                    status, payload = server.answer(body, self._wait)
                    pace = payload.pop("token_delay", server.token_delay_s)
                    if self._client_left():
                        raise _ClientLeft
                    if status == 200 and body.get("stream"):
                        asked = bool((body.get("stream_options") or {}).get("include_usage"))
                        include_usage = asked and server.stream_usage
                        self._stream(server.chunks(payload, include_usage=include_usage), pace)
                    else:
                        self._send(status, payload)
                except (_ClientLeft, BrokenPipeError, ConnectionResetError):
                    with server._lock:
                        server.disconnects.append(body)
                    self.close_connection = True

            def _client_left(self) -> bool:
                """True when the client closed its end (readable with no data) while it waits for us."""
                try:
                    readable, _, _ = select.select([self.connection], [], [], 0)
                    return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def _wait(self, seconds: float) -> None:
                deadline = time.monotonic() + seconds
                while (left := deadline - time.monotonic()) > 0:
                    if self._client_left():
                        raise _ClientLeft
                    time.sleep(min(left, 0.05))

        return Handler


class _ClientLeft(Exception):
    """The client disconnected before its response was written."""


def main(argv: list[str]) -> None:
    """Serve a script from a JSON file (``{"scripts": {...}, "default": ...}``) until killed."""
    spec = json.loads(Path(argv[0]).read_text()) if argv else {}
    lm = ScriptedLM(spec.get("scripts"), default=spec.get("default")).start()
    print(lm.base_url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
