"""Run one short turn through the ``fleet`` kernel and one through the HTTP API, and say what the model did.

    python scripts/real_model.py --api http://127.0.0.1:PORT [--record CASSETTE] [--summary FILE]

Used by ``scripts/real-model.sh`` once a model server and ``fleet serve`` are up (same ``FLEET_HOME``).
The kernel turn runs over jupyter_client (the kernel prints its text live view); its events are then read
back from the API, and the API turn streams its own. Figures come from the events (``iteration.started``,
``lm.finished``, the terminal event) and the stored turn object. With ``--record`` the outcomes are written
into the cassette's ``turns`` list, so a replay test knows which tasks to ask and what to expect.
Exit status 0 when both turns reached a terminal state (a small model failing the task is still 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from jupyter_client.manager import start_new_kernel

KERNEL_TASK = "What is 17 * 3? Answer with the number only."
API_TASK = "How many words are in the sentence 'the quick brown fox jumps'? Answer with the number."
TERMINAL = ("turn.completed", "turn.failed", "turn.cancelled")


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The envelopes of a ``text/event-stream`` response, in order (comments and heartbeats skipped)."""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


def progress(event: dict[str, Any]) -> None:
    """One short line for the steps a person watching wants to see."""
    kind, data = event["type"], event["data"]
    if kind == "iteration.started":
        print(f"    iteration {data['iteration']}/{data['max_iters']}", flush=True)
    elif kind == "code":
        first = (data["code"].strip().splitlines() or [""])[0]
        print(f"      code: {first[:100]}", flush=True)
    elif kind == "lm.finished":
        usage = data.get("usage") or {}
        print(
            f"      {data['role']} LM call: {usage.get('prompt_tokens', 0)} prompt + "
            f"{usage.get('completion_tokens', 0)} completion tokens, {data['duration_ms'] / 1000:.1f} s",
            flush=True,
        )
    elif kind == "execution.finished" and data.get("error"):
        print(f"      code failed: {data['error']['type']}: {data['error']['message'][:100]}", flush=True)


def summarize(events: list[dict[str, Any]], turn: dict[str, Any]) -> dict[str, Any]:
    """What the turn did, from its events and its stored turn object."""
    lm = [e["data"] for e in events if e["type"] == "lm.finished"]
    iterations = [e["data"]["iteration"] for e in events if e["type"] == "iteration.started"]
    terminal = next((e for e in events if e["type"] in TERMINAL), None)
    seconds = None
    if events:
        first, last = (datetime.fromisoformat(e["ts"].replace("Z", "+00:00")) for e in (events[0], events[-1]))
        seconds = round((last - first).total_seconds(), 1)
    data = terminal["data"] if terminal else {}
    if terminal is None:
        message = "no terminal event"
    elif terminal["type"] == "turn.completed":
        message = f"answer: {data.get('answer')!r}" + (" (extracted after max_iters)" if data.get("extracted") else "")
    elif terminal["type"] == "turn.failed":
        message = f"{data['error']['type']}: {data['error']['message']}"
    else:
        message = f"cancelled: {data.get('reason')}"
    return {
        "task": turn.get("task"),
        "outcome": terminal["type"] if terminal else None,
        "status": turn.get("status"),
        "error_type": (data.get("error") or {}).get("type"),
        "extracted": bool(data.get("extracted")),
        "iterations": max(iterations, default=0),
        "lm_calls": len(lm),
        "prompt_tokens": sum((d.get("usage") or {}).get("prompt_tokens", 0) for d in lm),
        "completion_tokens": sum((d.get("usage") or {}).get("completion_tokens", 0) for d in lm),
        "seconds": seconds,
        "message": message,
    }


def report(path: str, summary: dict[str, Any]) -> None:
    print(
        f"\n{path} turn: {summary['outcome']} (stored status {summary['status']}) after {summary['iterations']} "
        f"iteration(s), {summary['lm_calls']} LM call(s), {summary['prompt_tokens']} prompt + "
        f"{summary['completion_tokens']} completion tokens, {summary['seconds']} s\n  {summary['message'][:400]}",
        flush=True,
    )


def kernel_turn(client: httpx.Client, task: str, timeout: float) -> dict[str, Any]:
    """Run ``task`` as one cell in a new ``fleet`` kernel; its events are then read back from the API."""
    print(f"\n==> Kernel turn (jupyter_client, kernel 'fleet'): {task}", flush=True)
    km, kc = start_new_kernel(kernel_name="fleet", startup_timeout=120)
    meta: dict[str, Any] = {}
    try:
        msg_id = kc.execute(task)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                print("    | " + content["text"].rstrip().replace("\n", "\n    | "), flush=True)
            elif kind == "execute_result":
                meta = content["metadata"].get("fleet", {})
            elif kind == "error":
                print(f"    cell error: {content['ename']}: {content['evalue'][:300]}", flush=True)
            elif kind == "status" and content["execution_state"] == "idle":
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    if not meta:
        raise SystemExit("the kernel turn gave no execute_result with fleet metadata")
    base = f"/api/sessions/{meta['session_id']}/turns/{meta['turn_id']}"
    with client.stream("GET", f"{base}/events", params={"after": 0}) as response:
        response.raise_for_status()
        events = list(sse_events(response))
    return summarize(events, client.get(base).json())


def api_turn(client: httpx.Client, task: str) -> dict[str, Any]:
    """Create a session and run ``task`` as one turn over HTTP, streaming its events."""
    print(f"\n==> API turn (POST /api/sessions/{{id}}/turns): {task}", flush=True)
    session = client.post("/api/sessions", json={"title": "real model"}).json()["session_id"]
    events: list[dict[str, Any]] = []
    with client.stream("POST", f"/api/sessions/{session}/turns", json={"task": task}) as response:
        response.raise_for_status()
        turn_id = response.headers["Fleet-Turn-Id"]
        for event in sse_events(response):
            events.append(event)
            progress(event)
    return summarize(events, client.get(f"/api/sessions/{session}/turns/{turn_id}").json())


def note_turns(cassette: Path, turns: list[dict[str, Any]]) -> None:
    """Write what was asked, under which limits, and how it ended into the cassette's header (for replays)."""
    data = json.loads(cassette.read_text(encoding="utf-8"))
    keep = ("task", "outcome", "error_type", "extracted", "iterations", "lm_calls")
    data["turns"] = [{"path": t["path"], **{k: t[k] for k in keep}} for t in turns]
    if os.environ.get("FLEET_CONFIG"):
        data["limits"] = tomllib.loads(Path(os.environ["FLEET_CONFIG"]).read_text(encoding="utf-8"))["limits"]
    cassette.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, help="base URL of a running fleet serve")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the kernel turn")
    parser.add_argument("--record", type=Path, help="the cassette being recorded (FLEET_LM_RECORD)")
    parser.add_argument("--summary", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    with httpx.Client(base_url=args.api, timeout=httpx.Timeout(30, read=None)) as client:
        turns = [
            {"path": "kernel", **kernel_turn(client, KERNEL_TASK, args.timeout)},
            {"path": "API", **api_turn(client, API_TASK)},
        ]
    for turn in turns:
        report(turn["path"], turn)
    if args.record:
        note_turns(args.record, turns)
    if args.summary:
        args.summary.write_text(json.dumps(turns, indent=1) + "\n", encoding="utf-8")
    return 0 if all(t["outcome"] for t in turns) else 1


if __name__ == "__main__":
    sys.exit(main())
