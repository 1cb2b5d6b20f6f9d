"""Streaming for the LM calls dspy sends through LiteLLM, with the same result as a whole reply.

dspy's native engine (lm15) serves the providers it knows (OpenAI, Anthropic, Gemini, vLLM, Ollama, ...);
a call to any other (``lm_studio/``, ``together_ai/``, ``mistral/``, ``bedrock/``, ``vertex_ai/``, ...) goes
through its compatibility engine, which asks ``dspy.clients.lm.litellm_completion`` for a whole reply.
``install`` puts ``streamed_completion`` in that function's place, once per process: when a turn's call is
listening (``streaming.current()``, set by ``MeteredLM`` for its own calls only) it asks LiteLLM for the same
request as a stream (``stream=True``, usage in the last chunk), tells each piece of text and of the
provider's thinking to the call's ``StreamReader`` (so the budget can stop it between two pieces), and
rebuilds the reply with ``litellm.stream_chunk_builder``: the ``ModelResponse`` dspy goes on with has the
same text, thinking, finish reason, usage and cost as the whole reply. Any other caller, and a call made
while dspy's own streaming (``streamify``) is on, gets dspy's function unchanged. A typed ``Request`` sent
through LiteLLM (a cassette's recorder sends one) goes to the engine's ``complete`` instead, which reads
the engine's own stream (``read_as_stream``, as for a native engine).

A stream being read is kept in its call's ``live`` set, so that ``MeteredLM.abort`` (the turn stopped) can
cut it at once, from another thread, even while the provider sends nothing (``cut``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import socket
from collections.abc import Callable
from typing import Any

from fleet_kernel.engine.streaming import CHARS_PER_TOKEN, StreamReader, current, read_as_stream

NO_CACHE = {"no-cache": True, "no-store": True}

Completion = Callable[..., Any]


def install() -> None:
    """Route dspy's LiteLLM chat completions through ``streamed_completion``, and its typed ``Request`` calls
    through LiteLLM through ``read_as_stream`` (idempotent)."""
    lm_module: Any = importlib.import_module("dspy.clients.lm")  # dspy ships no types: looked up by name
    original = lm_module.litellm_completion
    if getattr(original, "fleet_streams", False):
        return

    def litellm_completion(request: dict[str, Any], num_retries: int, cache: dict[str, Any] | None = None) -> Any:
        return streamed_completion(original, request, num_retries, cache)

    litellm_completion.fleet_streams = True  # type: ignore[attr-defined]
    lm_module.litellm_completion = litellm_completion

    # a typed Request (a cassette's recorder sends one) goes to the engine's ``complete``, not the function
    # above; its own ``stream`` gives lm15 events, which ``read_as_stream`` reads as the native path does
    engine_class: Any = importlib.import_module("dspy.clients.engines.litellm_engine").LiteLLMEngine
    whole = engine_class.complete

    def complete(engine: Any, request: Any) -> Any:
        if engine.model_type != "chat":  # LiteLLM's engine streams chat completions only
            return whole(engine, request)
        return read_as_stream(request, engine.stream, functools.partial(whole, engine))

    engine_class.complete = complete


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The messages' tokens, roughly (characters over four), as ``streaming.prompt_tokens`` counts them."""
    chars = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(part.get("text") or "")) for part in content if isinstance(part, dict))
    return chars // CHARS_PER_TOKEN


def streamed_completion(
    original: Completion, request: dict[str, Any], num_retries: int, cache: dict[str, Any] | None = None
) -> Any:
    """dspy's ``litellm_completion(request, num_retries, cache)``, streamed for a listening turn call."""
    dspy: Any = importlib.import_module("dspy")
    call = current()
    if call is None or dspy.settings.send_stream is not None or request.get("stream"):
        return original(request, num_retries, cache)
    lm_module: Any = importlib.import_module("dspy.clients.lm")
    litellm: Any = lm_module._get_litellm()
    body = dict(request)
    body.pop("rollout_id", None)
    headers = lm_module._add_dspy_identifier_to_headers(body.pop("headers", None))
    messages = body.get("messages") or []
    source = litellm.completion(
        cache=cache or NO_CACHE,
        num_retries=num_retries,
        retry_strategy="exponential_backoff_retry",
        headers=headers,
        **{**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    reader = StreamReader(call, prompt_tokens(messages))
    chunks: list[Any] = []
    usage_seen = False
    call.live.add(source)
    try:
        with contextlib.closing(source):
            for chunk in source:
                chunks.append(chunk)
                usage_seen = usage_seen or getattr(chunk, "usage", None) is not None
                for choice in getattr(chunk, "choices", None) or ():
                    delta = getattr(choice, "delta", None)
                    thinking = getattr(delta, "reasoning_content", None)
                    if thinking:
                        reader.thinking(str(thinking))
                    text = getattr(delta, "content", None)
                    if text:
                        reader.text(str(text))
    except BaseException as exc:
        reader.failed(exc)
        raise
    finally:
        call.live.discard(source)
        reader.close()
    if not usage_seen:  # LiteLLM would count the prompt with the model's tokenizer (a download, for some)
        rebuilt = litellm.stream_chunk_builder(chunks, messages=messages, count_prompt_tokens=lambda: reader.prompt)
    else:
        rebuilt = litellm.stream_chunk_builder(chunks, messages=messages)
    if rebuilt is None:
        from dspy.lm15 import ProviderError  # noqa: PLC0415 - dspy's module, only on this error path

        raise ProviderError("the provider's stream ended without a reply")
    return rebuilt


def cut(source: Any) -> None:
    """End a LiteLLM stream being read on another thread, now: shut its socket down (which wakes a read
    that waits for the provider; closing alone would not), then close it. Best effort: a stream whose
    socket cannot be found is closed, and its reader stops at the next piece."""
    inner = getattr(source, "completion_stream", None)
    for name in ("response", "http_response"):
        response = getattr(inner, name, None)
        extensions = getattr(response, "extensions", None) or {}
        network = extensions.get("network_stream") if isinstance(extensions, dict) else None
        sock = network.get_extra_info("socket") if network is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return
    with contextlib.suppress(Exception):
        source.close()
