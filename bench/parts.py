"""Where a Fleet iteration's time goes: raw dspy.RLM given Fleet's parts one by one, against Fleet's turn.

    .venv/bin/python bench/parts.py --repeat 12

Every column runs 20-iteration turns on the same scripted LM (its own process); per iteration is the
time from a turn's first LM request to its last, over the iterations between (``per_iteration``):

- raw dspy.RLM with ``dspy.LocalInterpreter`` (the baseline of ``bench/engine.py``);
- raw dspy.RLM with Fleet's local sandbox from the pool as its interpreter;
- the same, also with the signature, host tools and inputs a Fleet turn gives its RLM (recorded from a
  real in-process turn: instructions, skills and memory tools, history and the workspace manifest);
- Fleet in-process: the engine's observer, events, store and delivery on top of all of that.

The difference between the last two is the engine's own cost; the others are what a turn is given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dspy
from engine import MODEL, SETTLE_S, FleetTask, InProcess, LMProcess, Raw, per_iteration, script

from fleet_kernel.config import load_settings
from fleet_kernel.sandbox import open_sandbox


def record_turn_arguments(inproc: InProcess) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """The arguments and inputs Fleet's engine gives ``dspy.RLM`` in one turn (its signature, tools…)."""
    seen: dict[str, Any] = {}
    init, forward = dspy.RLM.__init__, dspy.RLM.forward

    def recording_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.setdefault("init", (args, kwargs))
        init(self, *args, **kwargs)

    def recording_forward(self, **inputs):  # type: ignore[no-untyped-def]
        seen.setdefault("inputs", {k: v for k, v in inputs.items() if k not in ("interpreter_factory", "task")})
        return forward(self, **inputs)

    dspy.RLM.__init__, dspy.RLM.forward = recording_init, recording_forward  # type: ignore[method-assign]
    try:
        inproc.turn(1, "record the turn's arguments")
    finally:
        dspy.RLM.__init__, dspy.RLM.forward = init, forward  # type: ignore[method-assign]
    args, kwargs = seen["init"]
    return args, {"tools": kwargs.get("tools")}, seen["inputs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=12)
    repeat = parser.parse_args().repeat
    home = tempfile.mkdtemp(prefix="fleet-parts-")
    with LMProcess() as server:
        env = {**os.environ, "FLEET_HOME": home, **server.env(), "FLEET_LM_MODEL": MODEL}
        env.pop("FLEET_SANDBOX", None)
        settings = load_settings(env)
        raw, inproc = Raw(server), InProcess(env, server)
        (signature,), tools, inputs = record_turn_arguments(inproc)

        def sandboxed(key: str, fleet_arguments: bool) -> None:
            server.add(key, script(20))
            workspace = Path(home) / key.replace(" ", "-")
            workspace.mkdir()
            factory = open_sandbox(settings, workspace)
            if fleet_arguments:
                task_signature, options, given = signature, tools, inputs
            else:
                task_signature, options, given = FleetTask, {}, {"history": "", "workspace": ""}
            rlm = dspy.RLM(task_signature, max_iters=21, interpreter_factory=factory, **options)
            try:
                with dspy.context(lm=raw.lm):
                    rlm(task=key, **given)
            finally:
                factory.close()

        columns = {
            "raw dspy.RLM + LocalInterpreter": lambda key: raw.turn(20, key),
            "raw dspy.RLM + Fleet's sandbox": lambda key: sandboxed(key, False),
            "  + Fleet's signature, tools, inputs": lambda key: sandboxed(key, True),
            "Fleet in-process (+ observer, events, store)": lambda key: inproc.turn(20, key),
        }
        for name, run in columns.items():  # warm-ups
            run(f"warm-up {name}")
        time.sleep(SETTLE_S)
        steps: dict[str, list[float]] = {name: [] for name in columns}
        for i in range(repeat):  # interleaved: the columns share the load of each moment
            for name, run in columns.items():
                run(f"{name} {i}")
                steps[name].append(per_iteration(server, f"{name} {i}"))
                time.sleep(SETTLE_S)
        inproc.close()
    print(f"\nPer iteration of a 20-iteration turn, first to last LM request (median of {repeat})")
    print()
    base = statistics.median(steps["raw dspy.RLM + LocalInterpreter"])
    for name, samples in steps.items():
        median = statistics.median(samples)
        print(f"{name:>45} | {median * 1000:6.2f} ms | {median / base:.2f}x")


if __name__ == "__main__":
    main()
