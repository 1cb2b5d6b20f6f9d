"""Benchmark of streamed LM tokens: from the provider writing a token to a watcher seeing it.

    .venv/bin/python bench/streaming.py [--samples 3] [--pace 0.05]

The scripted LM (tests/scripted_lm.py) streams each reply in 4-character chunks, ``--pace`` seconds apart,
and notes the wall-clock time it writes each one. "Provider first token" is the write of the first chunk
holding reasoning text (the ``[[ ## reasoning ## ]]`` header before it is no visible token); "first
visible token" is when a watcher has it on screen:

- SSE client: the first ``lm.delta`` frame read by an httpx client of ``POST /api/sessions/{id}/turns``
  (the API in this process, uvicorn in a thread; the turn in its runner);
- kernel, console text (``FLEET_OUTPUT=text``, what ``jupyter console`` prints): the first IOPub ``stream``
  message after which the printed text shows the reasoning's first characters;
- kernel, widget card (a widget frontend such as JupyterLab): the first ``comm_msg`` whose HTML holds them.

Also "execute -> first visible token": from the kernel's ``execute_request`` to that message, which
includes the turn's start (sandbox, prompt) and the provider's own time to its first token.

Then what reading a reply as a stream costs: CPU of the calling thread per LM call (``time.thread_time``, so
the scripted LM's own threads are not counted), a whole reply against the same reply streamed into a sink
that keeps nothing. The difference is dspy's own stream reader (lm15's HTTP, SSE and chunk parsing and its
assembler), before Fleet does anything with a token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
from jupyter_client.manager import start_new_kernel  # noqa: E402
from live_api import LiveServer, iter_frames  # noqa: E402
from scripted_lm import ScriptedLM, step  # noqa: E402

from fleet_kernel.config import load_settings  # noqa: E402
from fleet_kernel.engine.metered import MeteredLM  # noqa: E402
from fleet_kernel.engine.streaming import CallStream, streaming  # noqa: E402
from fleet_kernel.kernel.install import install  # noqa: E402

HEADER = "[[ ## reasoning ## ]]\n"
REASONING = "Zebras first: I count the stripes, then write the code that checks them. " * 2


def first_visible(lm: ScriptedLM, since: int) -> float:
    """When the provider wrote the first chunk holding reasoning text, among chunks ``since`` on."""
    written = 0
    for at, piece in lm.sent[since:]:
        written += len(piece)
        if written > len(HEADER):
            return at
    raise RuntimeError("no reasoning text was streamed")


def reply_start(lm: ScriptedLM) -> int:
    """Index in ``lm.sent`` where the next reply begins."""
    return len(lm.sent)


def sse_sample(client: httpx.Client, lm: ScriptedLM, session_id: str, task: str) -> float:
    start = reply_start(lm)
    seen = None
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": task}) as response:
        for frame in iter_frames(response):
            if frame.event == "lm.delta" and seen is None:
                seen = time.time()
            if frame.event in ("turn.completed", "turn.failed", "turn.cancelled"):
                break
    assert seen is not None, "no lm.delta"
    return (seen - first_visible(lm, start)) * 1000


def kernel_sample(kc: Any, lm: ScriptedLM, task: str, widget: bool) -> tuple[float, float]:
    """(provider first token -> visible, execute -> visible) in ms, for one cell."""
    start = reply_start(lm)
    began = time.time()
    msg_id = kc.execute(task)
    printed, seen = "", None
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if seen is None and not widget and kind == "stream":
            printed += msg["content"]["text"]
            if "reasoning: Z" in printed:
                seen = time.time()
        if seen is None and widget and kind == "comm_msg" and 'font-style:italic">Z' in str(msg["content"]):
            seen = time.time()
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    while kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
        pass
    assert seen is not None, "the reasoning never showed"
    return (seen - first_visible(lm, start)) * 1000, (seen - began) * 1000


def attach_widget_manager(kc: Any) -> None:
    content = {"comm_id": uuid.uuid4().hex, "target_name": "jupyter.widget.control", "data": {}}
    kc.shell_channel.send(kc.session.msg("comm_open", content, metadata={"version": "1.0.0"}))
    kc.execute_interactive("%fleet output", timeout=60)


def steps(n: int) -> list[dict[str, Any]]:
    return [step(REASONING, "SUBMIT(answer='ok')") for _ in range(n)]


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} {max(values):7.1f}"


def run(samples: int, pace: float) -> list[tuple[str, list[float]]]:
    rows: list[tuple[str, list[float]]] = []
    home = Path(tempfile.mkdtemp(prefix="fleet-bench-stream-"))
    with ScriptedLM(default=steps(1)[0], token_delay_s=pace) as lm:
        env = {"FLEET_HOME": str(home), "FLEET_SANDBOX": "local", **lm.env()}
        settings = load_settings(env)
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120) as client:
            session_id = client.post("/api/sessions", json={"title": "bench"}).json()["session_id"]
            sse_sample(client, lm, session_id, "warm up")
            rows.append(("SSE client", [sse_sample(client, lm, session_id, f"t{i}") for i in range(samples)]))

        prefix = home / "jupyter"
        install(prefix=str(prefix), name="fleet-bench")
        os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
        for label, widget in (("kernel, console text", False), ("kernel, widget card", True)):
            kernel_env = {**os.environ, **env, "FLEET_HOME": str(home / label.split()[-1])}
            if not widget:
                kernel_env["FLEET_OUTPUT"] = "text"
            km, kc = start_new_kernel(kernel_name="fleet-bench", env=kernel_env, startup_timeout=60)
            try:
                if widget:
                    attach_widget_manager(kc)
                kernel_sample(kc, lm, "warm up", widget)
                got = [kernel_sample(kc, lm, f"cell {i}", widget) for i in range(samples)]
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            rows.append((label, [g[0] for g in got]))
            rows.append((f"{label}: execute -> first token", [g[1] for g in got]))
    return rows


class NoSink:
    """A stream's sink that keeps nothing."""

    def text(self, text: str) -> None:
        pass

    def thinking(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def read_cost(calls: int) -> tuple[float, float, int]:
    """(whole, streamed) CPU ms of this thread per call, alternating in rounds, and the chunks of one reply."""
    with ScriptedLM(sub=lambda _prompt: HEADER + REASONING) as lm:  # a plain call's reply: as long as a step's
        # a model name dspy's price table knows (see bench/engine.py): an unknown one is priced by a table scan
        model = MeteredLM("openai/gpt-4o-mini", api_base=lm.base_url, api_key="sk-bench", cache=False)
        messages = [{"role": "user", "content": "Count the zebras."}]
        call = CallStream(open=NoSink, check=lambda _tokens: None, stopped=lambda _usage: None)
        model.forward(messages=messages)  # warm-up: imports, the connection
        with streaming(call):
            model.forward(messages=messages)

        def per_call(streamed: bool) -> float:
            began = time.thread_time()
            with streaming(call) if streamed else contextlib.nullcontext():
                for _ in range(calls // 10):
                    model.forward(messages=messages)
            return (time.thread_time() - began) * 1000 / (calls // 10)

        rounds = [(per_call(False), per_call(True)) for _ in range(10)]
        chunks = lm.streamed[0]  # noted by the server's thread after its last write: read once others followed
    return statistics.median(w for w, _ in rounds), statistics.median(s for _, s in rounds), chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.05, help="seconds between the provider's chunks")
    parser.add_argument("--calls", type=int, default=200, help="LM calls each way for the read cost")
    args = parser.parse_args()
    threading.current_thread().name = "bench"
    rows = asyncio.run(asyncio.to_thread(run, args.samples, args.pace))
    print(
        f"\nprovider first token -> first visible token (ms), scripted LM at {args.pace * 1000:.0f} ms a chunk, "
        f"{args.samples} samples each\n"
    )
    print(f"| {'watcher':<48} | median |     max |")
    print(f"|{'-' * 50}|--------:|--------:|")
    for label, values in rows:
        median, most = summary(values).split()
        print(f"| {label:<48} | {median:>6} | {most:>7} |")
    whole, streamed, chunks = read_cost(args.calls)
    rounds = f"median of 10 rounds of {args.calls // 10}"
    print(f"\nCPU of the calling thread per LM call ({chunks} chunks a reply, {rounds})\n")
    print(f"| {'reply':<48} |     ms |")
    print(f"|{'-' * 50}|-------:|")
    print(f"| {'whole':<48} | {whole:>6.2f} |")
    print(f"| {'streamed (dspy reads it; the sink keeps nothing)':<48} | {streamed:>6.2f} |")
    print(f"| {'difference: per chunk (us)':<48} | {(streamed - whole) * 1000 / chunks:>6.1f} |")


if __name__ == "__main__":
    main()
