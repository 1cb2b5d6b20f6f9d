"""First-request prompt size: Fleet's against raw ``dspy.RLM`` + ``dspy.LocalInterpreter``, per task.

    .venv/bin/python bench/prompt_tokens.py [--tokenizer PYTHON --model FILE.gguf]

The five tasks of ``scripts/real-model.sh`` (the same text, the same data) go once through a Fleet turn
(``TurnRunner``, the data as input variables, as ``%%fleet --in`` sends them) and once through raw
``dspy.RLM``, both against the scripted LM, which records each request and answers ``SUBMIT`` at once.
The first root request of each is measured: in tokens of the model's own tokenizer when ``--tokenizer``
(a Python with llama-cpp-cffi, such as ``.venv-model/bin/python``) and ``--model`` are given, else in
characters / 4. Target (issue 27): Fleet's first prompt at most 1.2x raw's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from scripted_lm import ScriptedLM, step, text_of  # noqa: E402

from fleet_kernel.config import load_settings  # noqa: E402
from fleet_kernel.engine import TurnRunner  # noqa: E402
from fleet_kernel.engine.inputs import encode  # noqa: E402
from fleet_kernel.store import Store  # noqa: E402


def suite() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))  # scripts/real_model.py: the tasks and their data
    return importlib.import_module("real_model")


def chat_text(body: dict[str, Any]) -> str:
    return "\n".join(f"<{m.get('role')}>\n{text_of(m.get('content'))}" for m in body.get("messages") or [])


async def fleet_prompt(lm: ScriptedLM, home: Path, task: Any) -> str:
    before = len(lm.requests)
    settings = load_settings({"FLEET_HOME": str(home), **lm.env()})
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    try:
        session = await store.create_session()
        inputs = [encode(name, value) for name, value in task.inputs.items()]
        handle = await runner.start(session.session_id, task.kernel, inputs=inputs, output_schema=task.schema)
        async for _ in handle.events():
            pass
    finally:
        await runner.close()
        await store.close()
    return chat_text(next(b for b in lm.requests[before:] if lm.is_root(b)))


def raw_prompt(lm: ScriptedLM, task: Any) -> str:
    before = len(lm.requests)
    model = dspy.LM("openai/scripted", api_base=lm.base_url, api_key="sk-test", cache=False, num_retries=0)
    rlm = dspy.RLM(
        dspy.Signature(task.raw_signature, task.kernel),
        max_iters=2,
        sub_lm=model,
        interpreter_factory=dspy.LocalInterpreter,
    )
    inputs = dict(task.inputs) if task.inputs else {"task": task.kernel}
    try:
        with dspy.context(lm=model):
            rlm(**inputs)
    except Exception as exc:  # noqa: BLE001 - only the first request is measured
        print(f"  (raw {task.name}: {type(exc).__name__})", file=sys.stderr)
    return chat_text(lm.requests[before])


def count(texts: list[str], tokenizer: str | None, model: str | None) -> list[int]:
    if not (tokenizer and model):
        return [len(t) // 4 for t in texts]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(texts, handle)
    out = subprocess.run(
        [tokenizer, str(ROOT / "scripts" / "model_server.py"), "--model", model, "--tokenize", handle.name],
        capture_output=True,
        text=True,
        check=True,
    )
    os.unlink(handle.name)
    return [int(n) for n in json.loads(out.stdout)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a Python with llama-cpp-cffi (e.g. .venv-model/bin/python)")
    parser.add_argument("--model", help="the GGUF whose tokenizer counts (e.g. ~/.cache/fleet/models/...gguf)")
    parser.add_argument("--show", help="print both first prompts of this task")
    args = parser.parse_args()
    rm = suite()
    done = {"*": [step("Done.", "SUBMIT(answer='1', rows=1, max_amount=1.0, result={'rows': 1, 'max_amount': 1.0})")]}
    rows = []
    with ScriptedLM(done, default=done["*"][0]) as lm, tempfile.TemporaryDirectory() as scratch:
        for task in rm.tasks(rm.make_log()):
            fleet = asyncio.run(fleet_prompt(lm, Path(scratch) / task.name, task))
            raw = raw_prompt(lm, task)
            rows.append((task.name, fleet, raw))
            if args.show == task.name:
                print(f"--- Fleet\n{fleet}\n--- raw\n{raw}")
    counts = count([t for _, f, r in rows for t in (f, r)], args.tokenizer, args.model)
    unit = "tokens" if args.tokenizer and args.model else "chars/4"
    print(f"\nfirst root request, {unit}   (target: Fleet <= 1.2x raw)")
    print(f"{'task':<14} {'Fleet':>7} {'raw':>7} {'ratio':>6}")
    for i, (name, _, _) in enumerate(rows):
        fleet, raw = counts[2 * i], counts[2 * i + 1]
        print(f"{name:<14} {fleet:>7} {raw:>7} {fleet / raw:>6.2f}")


if __name__ == "__main__":
    main()
