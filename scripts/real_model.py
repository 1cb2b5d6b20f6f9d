"""Five small tasks through Fleet (a notebook kernel and the HTTP API) and through raw ``dspy.RLM``, on one model.

    python scripts/real_model.py --api http://127.0.0.1:PORT --lm-url http://127.0.0.1:PORT/v1 [options]

Used by ``scripts/real-model.sh`` once a model server and ``fleet serve`` are up (same ``FLEET_HOME``). Each
task runs three ways on the same model server:

- ``kernel``: a ``%%fleet --in ...`` cell in a python3 kernel (jupyter_client), its data as notebook
  variables; the turn's events are then read back from the API;
- ``api``: ``POST /api/sessions/{id}/turns``, its data as attachments (files in the workspace);
- ``raw``: ``dspy.RLM`` with ``dspy.LocalInterpreter``, its data as input variables, in this process.

It prints a table per task: correct or not, iterations, prompt/completion tokens, seconds, and why each
failure failed; then the first request's prompt tokens, Fleet against raw. With ``--record DIR`` the
kernel's and the API's model exchanges go to cassettes in DIR (one more API turn, under a tiny
``[lm] max_tokens``, records a reply cut at the cap), each with the turns it holds, for replay tests.
Exit status 0 when every run reached an end (a small model getting a task wrong is still 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

TERMINAL = ("turn.completed", "turn.failed", "turn.cancelled")
PATHS = ("kernel", "api", "raw")
LIMITS = {"max_iters": 5, "max_llm_calls": 12, "turn_timeout_s": 900, "max_output_chars": 2000}
MAX_TOKENS = 768
TRUNCATED_MAX_TOKENS = 40  # the second fleet serve of a --record run: a reply cut at the cap


def write_configs(folder: Path) -> None:
    """``fleet.toml`` for the runs and ``fleet-truncated.toml`` for the cut reply, in ``folder``."""
    limits = "[limits]\n" + "".join(f"{k} = {v}\n" for k, v in LIMITS.items())
    for name, cap in (("fleet.toml", MAX_TOKENS), ("fleet-truncated.toml", TRUNCATED_MAX_TOKENS)):
        text = f"{limits}\n[lm]\nmax_tokens = {cap}\ntemperature = 0\nrequest_timeout_s = 600\n"
        (folder / name).write_text(text, encoding="utf-8")


# --- the data: made here, the same on every machine ------------------------------------------------------


def make_log(seed: int = 27, size: int = 1_000_000) -> str:
    """About ``size`` bytes of service log; some lines are ERROR, a few mention errors in other words."""
    rng = random.Random(seed)
    services = ["api", "worker", "db", "auth", "cache"]
    messages = {
        "INFO": ["request served in {n} ms", "user {n} logged in", "job {n} queued"],
        "DEBUG": ["cache hit for key k{n}", "retrying connection {n}"],
        "WARN": ["slow query took {n} ms", "no errors in the last {n} checks"],
        "ERROR": ["timeout after {n} ms", "connection refused by db-{n}", "job {n} crashed"],
    }
    lines, total, second = [], 0, 0
    while total < size:
        level = rng.choices(["INFO", "DEBUG", "WARN", "ERROR"], weights=[70, 15, 10, 5])[0]
        second += rng.randint(0, 3)
        text = rng.choice(messages[level]).format(n=rng.randint(1, 9999))
        line = (
            f"2026-12-01 {second // 3600 % 24:02d}:{second // 60 % 60:02d}:{second % 60:02d} {level} "
            f"{rng.choice(services)}: {text}"
        )
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def make_csv(seed: int = 27, rows: int = 24) -> str:
    rng = random.Random(seed)
    regions = ["north", "south", "east", "west"]
    out = ["order_id,region,amount"]
    for i in range(rows):
        out.append(f"{1001 + i},{rng.choice(regions)},{rng.randint(500, 99999) / 100:.2f}")
    return "\n".join(out) + "\n"


SENTENCE = "The committee postponed the extraordinarily long meeting until Friday afternoon"
REVIEWS = [
    "The battery died after two days, very disappointed.",
    "Absolutely love this blender, smoothies every morning!",
    "Shipping took a month and the box arrived crushed.",
    "Great value for the price, works exactly as described.",
    "The screen cracked the first week and support never answered.",
    "My kids play with it every day, best purchase this year.",
    "Comfortable, warm and the color is just as pictured.",
]
NEGATIVE = 3
SCHEMA = {
    "type": "object",
    "properties": {"rows": {"type": "integer"}, "max_amount": {"type": "number"}},
    "required": ["rows", "max_amount"],
}


def csv_amounts(text: str) -> list[float]:
    return [float(line.split(",")[2]) for line in text.strip().splitlines()[1:]]


# --- the tasks -------------------------------------------------------------------------------------------


@dataclass
class Task:
    """One task: how each path asks it, and how an answer is judged."""

    name: str
    kernel: str  # the %%fleet cell's text (its data as --in variables)
    api: str  # the API turn's task (its data as attached files)
    raw_signature: str  # dspy.RLM's signature (its data as inputs)
    expected: Any
    inputs: dict[str, Any] = field(default_factory=dict)  # variable name -> value (kernel --in, raw inputs)
    files: dict[str, str] = field(default_factory=dict)  # attachment name -> text (API)
    schema: dict[str, Any] | None = None
    uses_llm_query: bool = False


def tasks(log_text: str) -> list[Task]:
    sales = make_csv()
    amounts = csv_amounts(sales)
    errors = sum(1 for line in log_text.splitlines() if " ERROR " in f" {line} ")
    count = "How many lines of the log contain the word ERROR? Answer with the number only."
    total = "What is the sum of the amount column of the sales CSV? Answer with the number only."
    word = f"What is the longest word in this sentence: '{SENTENCE}'? Answer with the word only."
    classify = (
        "Classify each of the customer reviews as positive or negative with llm_query (one call per review), "
        "then answer with how many are negative, the number only."
    )
    stats = "How many data rows does the sales CSV have, and what is its largest amount?"
    return [
        Task(
            "errors",
            f"{count} The log is in `log`.",
            f"{count} The log is the attached file app.log.",
            "log: str -> answer: str",
            errors,
            inputs={"log": log_text},
            files={"app.log": log_text},
        ),
        Task(
            "csv_sum",
            f"{total} The CSV text is in `sales`.",
            f"{total} The CSV is the attached file sales.csv.",
            "sales: str -> answer: str",
            round(sum(amounts), 2),
            inputs={"sales": sales},
            files={"sales.csv": sales},
        ),
        Task("longest_word", word, word, "task: str -> answer: str", "extraordinarily"),
        Task(
            "classify",
            f"{classify} The reviews are the list `reviews`.",
            f"{classify} The reviews are the lines of the attached file reviews.txt.",
            "reviews: list[str] -> answer: str",
            NEGATIVE,
            inputs={"reviews": REVIEWS},
            files={"reviews.txt": "\n".join(REVIEWS) + "\n"},
            uses_llm_query=True,
        ),
        Task(
            "schema",
            f"{stats} The CSV text is in `sales`.",
            f"{stats} The CSV is the attached file sales.csv.",
            "sales: str -> rows: int, max_amount: float",
            {"rows": len(amounts), "max_amount": max(amounts)},
            inputs={"sales": sales},
            files={"sales.csv": sales},
            schema=SCHEMA,
        ),
    ]


def numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text or "")]


def judge(task: Task, answer: Any, result: Any) -> str | None:
    """None when the answer is right, else what was wrong."""
    if task.schema is not None:
        got = result if isinstance(result, dict) else None
        if got is None:
            return f"no typed result (answer {str(answer)[:80]!r})"
        ok = (
            got.get("rows") == task.expected["rows"]
            and abs(float(got.get("max_amount") or 0) - task.expected["max_amount"]) < 0.01
        )
        return None if ok else f"result {json.dumps(got)[:120]}, expected {json.dumps(task.expected)}"
    if isinstance(task.expected, str):
        words = re.findall(r"[A-Za-z]+", str(answer or ""))
        return None if task.expected in [w.lower() for w in words] else f"answered {str(answer)[:80]!r}"
    if any(abs(n - float(task.expected)) < 0.01 for n in numbers(str(answer))):
        return None
    return f"answered {str(answer)[:80]!r}, expected {task.expected}"


@dataclass
class Run:
    task: str
    path: str
    correct: bool = False
    ended: str = ""  # completed / extracted / failed / error
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_prompt_tokens: int = 0
    sub_calls: int = 0
    seconds: float = 0.0
    why: str = ""
    answer: str = ""
    turn: dict[str, Any] = field(default_factory=dict)  # what a replay needs (Fleet paths)


# --- Fleet: events to a run ------------------------------------------------------------------------------


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The envelopes of a ``text/event-stream`` response, in order (comments and heartbeats skipped)."""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


def from_events(task: Task, path: str, events: list[dict[str, Any]]) -> Run:
    run = Run(task.name, path)
    lm = [e["data"] for e in events if e["type"] == "lm.finished"]
    root = [d for d in lm if d.get("role") != "sub"]
    run.iterations = max((e["data"]["iteration"] for e in events if e["type"] == "iteration.started"), default=0)
    run.prompt_tokens = sum((d.get("usage") or {}).get("prompt_tokens", 0) for d in lm)
    run.completion_tokens = sum((d.get("usage") or {}).get("completion_tokens", 0) for d in lm)
    run.first_prompt_tokens = ((root[0].get("usage") or {}).get("prompt_tokens", 0)) if root else 0
    run.sub_calls = len(lm) - len(root)
    if events:
        first, last = (datetime.fromisoformat(e["ts"].replace("Z", "+00:00")) for e in (events[0], events[-1]))
        run.seconds = round((last - first).total_seconds(), 1)
    end = next((e for e in events if e["type"] in TERMINAL), None)
    if end is None:
        run.ended, run.why = "error", "no terminal event"
        return run
    data = end["data"]
    if end["type"] == "turn.completed":
        run.answer = str(data.get("answer") or "")
        run.ended = "extracted" if data.get("extracted") else "completed"
        wrong = judge(task, run.answer, data.get("result"))
        run.correct = wrong is None
        reasons = []
        if wrong:
            reasons.append(wrong)
        if data.get("extracted"):
            reasons.append(f"no SUBMIT: extracted ({data.get('reason') or 'limit'})")
        if task.uses_llm_query and not run.sub_calls:
            reasons.append("no llm_query call")
        run.why = "; ".join(reasons)
    elif end["type"] == "turn.failed":
        run.ended = "failed"
        run.why = f"{data['error']['type']}: {data['error']['message']}"
    else:
        run.ended, run.why = "cancelled", str(data.get("reason"))
    return run


# --- the three paths ---------------------------------------------------------------------------------------


def run_api(client: httpx.Client, task: Task) -> Run:
    session = client.post("/api/sessions", json={"title": f"real model: {task.name}"}).json()["session_id"]
    ids = []
    for name, text in task.files.items():
        upload = client.post(
            "/api/attachments", data={"session_id": session}, files={"file": (name, text.encode(), "text/plain")}
        )
        upload.raise_for_status()
        ids.append(upload.json()["attachment_id"] if "attachment_id" in upload.json() else upload.json()["id"])
    body: dict[str, Any] = {"task": task.api}
    if ids:
        body["attachment_ids"] = ids
    if task.schema:
        body["output_schema"] = task.schema
    events: list[dict[str, Any]] = []
    with client.stream("POST", f"/api/sessions/{session}/turns", json=body) as response:
        response.raise_for_status()
        for event in sse_events(response):
            events.append(event)
            progress(event)
    run = from_events(task, "api", events)
    run.turn = turn_record(run, events, {k: v for k, v in body.items() if k != "attachment_ids"}, sorted(task.files))
    return run


def turn_record(run: Run, events: list[dict[str, Any]], body: dict[str, Any], files: list[str]) -> dict[str, Any]:
    """What a replay of ``run`` (made from ``events``) must show again: how it ended, its answer, steps, step
    errors and LM calls."""
    return {
        "task": run.task,
        "body": body,
        "files": files,
        "outcome": next((e["type"] for e in events if e["type"] in TERMINAL), None),
        "answer": run.answer,
        "extracted": run.ended == "extracted",
        "reason": next((e["data"].get("reason") for e in events if e["type"] == "turn.completed"), None),
        "iterations": run.iterations,
        "step_errors": [
            ((e["data"].get("error") or {}).get("type")) for e in events if e["type"] == "execution.finished"
        ],
        "lm_calls": sum(e["type"] == "lm.finished" for e in events),
        "error_type": next((e["data"]["error"]["type"] for e in events if e["type"] == "turn.failed"), None),
    }


class KernelPath:
    """A python3 kernel with ``%load_ext fleet_kernel``; each task is a ``%%fleet`` cell in a new session."""

    def __init__(self, client: httpx.Client, all_tasks: list[Task], env: dict[str, str]) -> None:
        from jupyter_client.manager import start_new_kernel

        self.client = client
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=120, env=env)
        values = {}
        for task in all_tasks:
            values.update(task.inputs)
        data = Path(env["FLEET_HOME"]) / "real-model-inputs.json"
        data.write_text(json.dumps(values), encoding="utf-8")
        self.execute(self.setup_cell(data))

    @staticmethod
    def setup_cell(data: Path) -> str:
        """The notebook's first cell: the magic, and every task's data as variables (read from ``data``)."""
        load = f"globals().update(json.load(open({str(data)!r})))"
        return f"%load_ext fleet_kernel\nimport json\n{load}\nSCHEMA = {SCHEMA!r}"

    def execute(self, code: str, timeout: float = 1800) -> dict[str, Any]:
        msg_id = self.kc.execute(code)
        meta: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind in ("display_data", "execute_result", "update_display_data"):
                meta = (content.get("metadata") or {}).get("fleet") or meta
            elif kind == "error":
                meta.setdefault("error", f"{content['ename']}: {content['evalue'][:300]}")
            elif kind == "status" and content["execution_state"] == "idle":
                break
        return meta

    @staticmethod
    def cell(task: Task) -> str:
        """The ``%%fleet`` cell that runs ``task`` (a replay sends the same one)."""
        flags = f"--in {','.join(task.inputs)} " if task.inputs else ""
        if task.schema:
            flags += "--schema SCHEMA "
        return f"%%fleet {flags}--out result\n{task.kernel}"

    def run(self, task: Task) -> Run:
        self.execute("%fleet session new")
        meta = self.execute(self.cell(task))
        if "turn_id" not in meta:
            return Run(task.name, "kernel", ended="error", why=meta.get("error", "the cell gave no Fleet turn"))
        base = f"/api/sessions/{meta['session_id']}/turns/{meta['turn_id']}"
        with self.client.stream("GET", f"{base}/events", params={"after": 0}) as response:
            response.raise_for_status()
            events = list(sse_events(response))
        run = from_events(task, "kernel", events)
        run.turn = turn_record(run, events, {"cell": self.cell(task)}, [])
        return run

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def run_raw(task: Task, lm_url: str, model: str) -> Run:
    """The task through plain ``dspy.RLM`` + ``dspy.LocalInterpreter`` on the same server."""
    import dspy

    lm = dspy.LM(
        f"openai/{model}",
        api_base=lm_url,
        api_key="none",
        cache=False,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        num_retries=0,
    )
    signature = dspy.Signature(task.raw_signature, task.kernel)
    rlm = dspy.RLM(
        signature,
        max_iters=LIMITS["max_iters"],
        max_llm_calls=LIMITS["max_llm_calls"],
        max_output_chars=LIMITS["max_output_chars"],
        sub_lm=lm,
        interpreter_factory=dspy.LocalInterpreter,
    )
    inputs = dict(task.inputs) if task.inputs else {"task": task.kernel}
    run = Run(task.name, "raw")
    started = time.monotonic()
    try:
        with dspy.context(lm=lm):
            prediction = rlm(**inputs)
    except Exception as exc:  # noqa: BLE001 - a failure is a row of the table
        run.ended, run.why = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        prediction = None
    run.seconds = round(time.monotonic() - started, 1)
    usage = [h.get("usage") or {} for h in lm.history]
    run.prompt_tokens = sum(u.get("prompt_tokens", 0) for u in usage)
    run.completion_tokens = sum(u.get("completion_tokens", 0) for u in usage)
    run.first_prompt_tokens = usage[0].get("prompt_tokens", 0) if usage else 0
    run.sub_calls = sum(1 for h in lm.history if "REPL" not in json.dumps(h.get("messages") or [])[:4000])
    if prediction is None:
        return run
    run.iterations = len(prediction.get("trajectory") or [])
    extracted = prediction.get("final_reasoning") == "Extract forced final output"
    run.ended = "extracted" if extracted else "completed"
    if task.schema:
        result = {"rows": prediction.get("rows"), "max_amount": prediction.get("max_amount")}
        run.answer = json.dumps(result)
        wrong = judge(task, run.answer, result)
    else:
        run.answer = str(prediction.get("answer"))
        wrong = judge(task, run.answer, None)
    run.correct = wrong is None
    reasons = [wrong] if wrong else []
    if extracted:
        reasons.append("no SUBMIT: extracted after max_iters")
    run.why = "; ".join(reasons)
    return run


def progress(event: dict[str, Any]) -> None:
    kind, data = event["type"], event["data"]
    if kind == "iteration.started":
        print(f"      iteration {data['iteration']}/{data['max_iters']}", flush=True)
    elif kind == "execution.finished" and data.get("error"):
        print(f"      code failed: {data['error']['type']}: {data['error']['message'][:100]}", flush=True)


# --- the table ---------------------------------------------------------------------------------------------


def table(runs: list[Run]) -> str:
    lines = []
    for name in dict.fromkeys(r.task for r in runs):
        lines.append(f"\n{name}")
        lines.append(
            f"  {'path':<7} {'ok':<4} {'ended':<10} {'iters':>5} {'prompt':>7} {'compl':>6} {'first':>6} "
            f"{'secs':>6}  why"
        )
        for r in (r for r in runs if r.task == name):
            lines.append(
                f"  {r.path:<7} {'yes' if r.correct else 'no':<4} {r.ended:<10} {r.iterations:>5} "
                f"{r.prompt_tokens:>7} {r.completion_tokens:>6} {r.first_prompt_tokens:>6} {r.seconds:>6}  "
                f"{r.why[:160]}"
            )
    lines.append("\nsolved, and first-request prompt tokens against raw's (mean ratio over the tasks):")
    raw = {r.task: r for r in runs if r.path == "raw"}
    for path in dict.fromkeys(r.path for r in runs):
        mine = [r for r in runs if r.path == path]
        ratios = [
            r.first_prompt_tokens / raw[r.task].first_prompt_tokens
            for r in mine
            if r.task in raw and raw[r.task].first_prompt_tokens and r.first_prompt_tokens
        ]
        ratio = f", first prompt {sum(ratios) / len(ratios):.2f}x raw" if ratios and path != "raw" else ""
        lines.append(
            f"  {path:<7} {sum(r.correct for r in mine)}/{len(mine)} correct, "
            f"{sum(r.prompt_tokens for r in mine)} prompt + {sum(r.completion_tokens for r in mine)} "
            f"completion tokens, {sum(r.seconds for r in mine):.0f} s{ratio}"
        )
    return "\n".join(lines)


def note_cassette(path: Path, turns: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """Write the turns it holds and the limits they ran under into a cassette's header (for replays)."""
    if not path.exists():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    data["turns"] = turns
    data["config"] = config
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one run, step by step, as the script reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-config", type=Path, help="write the runs' fleet.toml files into this folder, and stop")
    parser.add_argument("--api", help="base URL of a running fleet serve")
    parser.add_argument("--lm-url", help="the model server's OpenAI base URL (for raw dspy.RLM)")
    parser.add_argument("--model", default="local", help="the server's model name")
    parser.add_argument("--in", dest="log", type=Path, help="a log file for the ERROR task (default: one made here)")
    parser.add_argument("--tasks", default="", help="comma-separated task names (default: all five)")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: kernel, api, raw")
    parser.add_argument("--record", type=Path, help="the folder the cassettes are recorded in (with fleet serve's)")
    parser.add_argument("--truncated-api", help="a second fleet serve under a tiny [lm] max_tokens, for --record")
    parser.add_argument("--summary", type=Path, help="also write the runs as JSON here")
    args = parser.parse_args(argv)
    if args.write_config:
        write_configs(args.write_config)
        return 0
    if not args.api or not args.lm_url:
        parser.error("--api and --lm-url are needed to run the tasks")
    log_text = args.log.read_text(encoding="utf-8", errors="replace") if args.log else make_log()
    every = {t.name: t for t in tasks(log_text)}
    unknown = [n for n in args.tasks.split(",") if n and n not in every]
    if unknown:
        parser.error(f"unknown task(s) {unknown}: the tasks are {', '.join(every)}")
    chosen = [every[n] for n in args.tasks.split(",") if n] if args.tasks else list(every.values())
    paths = [p for p in args.paths.split(",") if p]
    runs: list[Run] = []
    env = dict(os.environ)
    if args.record:
        env["FLEET_LM_RECORD"] = str(args.record / "real-model-kernel.cassette.json")
    timeout = httpx.Timeout(30, read=None)
    truncated: list[dict[str, Any]] = []
    if args.truncated_api:
        with httpx.Client(base_url=args.truncated_api, timeout=timeout) as client:
            word = next(t for t in tasks("") if t.name == "longest_word")
            print("\n==> a reply cut at [lm] max_tokens (recorded for replay tests)", flush=True)
            cut = run_api(client, word)
            truncated.append(cut.turn | {"why": cut.why})
            print(f"    {cut.ended}: {cut.why[:300]}", flush=True)
        if args.record:  # its fleet serve records nothing more: the header can be written now
            cut_config = {"limits": LIMITS, "max_tokens": TRUNCATED_MAX_TOKENS}
            note_cassette(args.record / "real-model-truncated.cassette.json", truncated, cut_config)
    with httpx.Client(base_url=args.api, timeout=timeout) as client:
        kernel = KernelPath(client, chosen, env) if "kernel" in paths else None
        try:
            for task in chosen:
                for path in paths:
                    print(f"\n==> {task.name} via {path}", flush=True)
                    if path == "kernel" and kernel is not None:
                        runs.append(kernel.run(task))
                    elif path == "api":
                        runs.append(run_api(client, task))
                    else:
                        runs.append(run_raw(task, args.lm_url, args.model))
                    r = runs[-1]
                    if args.summary:  # after every run: a long run stopped early still leaves its figures
                        args.summary.write_text(json.dumps([x.__dict__ for x in runs], indent=1) + "\n", "utf-8")
                    if args.record:  # the same for the turns a replay needs (the cassette is still being written)
                        turns = [x.turn for x in runs if x.path == "api"]
                        (args.record / "real-model-api.turns.json").write_text(json.dumps(turns, indent=1), "utf-8")
                    print(
                        f"    {'correct' if r.correct else 'wrong'} ({r.ended}), {r.iterations} iterations, "
                        f"{r.prompt_tokens}+{r.completion_tokens} tokens, {r.seconds} s {r.why[:200]}",
                        flush=True,
                    )
        finally:
            if kernel:
                kernel.close()
    print(table(runs), flush=True)
    if args.record:
        config = {"limits": LIMITS, "max_tokens": MAX_TOKENS}
        note_cassette(args.record / "real-model-api.cassette.json", [r.turn for r in runs if r.path == "api"], config)
        (args.record / "real-model-api.turns.json").unlink(missing_ok=True)
        note_cassette(
            args.record / "real-model-kernel.cassette.json",
            [r.turn for r in runs if r.path == "kernel"],
            config,
        )
    if args.summary:
        args.summary.write_text(json.dumps([r.__dict__ for r in runs], indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.ended in ("completed", "extracted", "failed") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
