"""Qwen2.5-Coder-1.5B-Instruct's recorded ``%%fleet`` cells, replayed in a real python3 kernel.

``scripts/real-model.sh --record tests/data`` ran each task as a ``%%fleet --in ...`` cell in one python3
kernel, a new session each, its model served on loopback; ``real-model-kernel.cassette.json`` keeps the
model's exchanges and, in its header, each cell and how its turn ended. The replay runs the same notebook
(the same first cell, the same cells in the same order: each turn sees the notebook the ones before it
left) on the cassette and checks each turn shows what the live one did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kernel_harness import PythonKernel
from real_model_replays import DATA, assert_as_recorded, fleet_toml, load, suite

KERNEL = load("real-model-kernel.cassette.json")


def _turn_id(kernel: PythonKernel, cell: str) -> str:
    run = kernel.run(cell, timeout=300)
    for message in run.messages:
        turn_id = ((message["content"].get("metadata") or {}).get("fleet") or {}).get("turn_id")
        if turn_id:
            return str(turn_id)
    raise AssertionError(f"the cell ran no Fleet turn: {run.text()[-2000:]}")


@pytest.mark.slow
def test_the_replayed_cells_show_what_the_live_ones_did(tmp_path: Path, fleet_env: dict[str, str]) -> None:
    assert KERNEL["turns"], "no kernel recording (scripts/real-model.sh --record tests/data)"
    assert KERNEL["model"] == "openai/qwen2.5-coder-1.5b-instruct"
    (tmp_path / "fleet.toml").write_text(fleet_toml(KERNEL), encoding="utf-8")
    tasks = suite()
    values: dict[str, Any] = {}
    for task in tasks.tasks(tasks.make_log()):
        values.update(task.inputs)
    data = tmp_path / "real-model-inputs.json"
    data.write_text(json.dumps(values), encoding="utf-8")
    env = {
        **fleet_env,
        "FLEET_CONFIG": str(tmp_path / "fleet.toml"),
        "FLEET_LM_MODEL": f"replay/{DATA / 'real-model-kernel.cassette.json'}",
    }
    kernel = PythonKernel(env, load=False)
    try:
        kernel.ok(tasks.KernelPath.setup_cell(data))
        for turn in KERNEL["turns"]:
            kernel.ok("%fleet session new")
            stored = kernel.stored_events(_turn_id(kernel, turn["body"]["cell"]))
            events = [e.model_dump(mode="json") for e in stored]
            assert_as_recorded(events, turn)
    finally:
        kernel.close()
