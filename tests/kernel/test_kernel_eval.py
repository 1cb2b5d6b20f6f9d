"""Tests for ``%fleet eval`` and ``%fleet feedback`` through a real kernel, the real store and the scripted LM."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nbformat
import pytest
from kernel_harness import Kernel
from scripted_lm import step


@pytest.mark.slow
def test_eval_runs_a_data_set_in_fresh_sessions_and_keeps_the_kernels_session(
    kernel: Kernel, scripted_lm, tmp_path: Path
) -> None:
    scripted_lm.add("my own turn", [step("Done.", "SUBMIT(answer='mine')")])
    assert kernel.run("my own turn").reply["content"]["status"] == "ok"
    data = tmp_path / "set.jsonl"
    data.write_text(
        json.dumps({"id": "add", "task": "What is 1+1? (add)", "expected": 2, "scorer": "numeric"})
        + "\n"
        + json.dumps({"id": "hello", "task": "Say hello (hello)", "expected": "hello", "scorer": "contains"})
        + "\n"
    )
    scripted_lm.add("(add)", [step("Add.", "SUBMIT(answer='2')")] * 2)
    scripted_lm.add("(hello)", [step("Greet.", "SUBMIT(answer='Hello there')"), step("Greet.", "SUBMIT(answer='Bye')")])
    out = tmp_path / "out"
    run = kernel.run(f"%fleet eval {data} --repeat 2 --out {out}", timeout=180)
    assert run.reply["content"]["status"] == "ok", run.reply["content"]
    markdown = "".join(c["data"].get("text/markdown", "") for c in run.of("display_data"))
    assert "0.75" in markdown and "3/4" in markdown and "report.html" in markdown
    # progress while it ran: one display, updated in place as each run ended, before the table
    progress = [m for m in run.messages if m["content"].get("data", {}).get("text/plain", "").startswith("eval: ")]
    assert [m["msg_type"] for m in progress] == ["display_data"] + ["update_display_data"] * 4
    assert len({m["content"]["transient"]["display_id"] for m in progress}) == 1
    lines = [m["content"]["data"]["text/plain"] for m in progress]
    assert lines[0] == "eval: starting the runs…"
    assert [line.split(" · ")[0] for line in lines[1:]] == [f"eval: {n}/4 runs done" for n in range(1, 5)]
    assert run.messages.index(progress[-1]) < max(i for i, t in enumerate(run.types) if t == "display_data")
    saved = json.loads((out / "results.json").read_text())
    assert [r["score"] for r in saved["results"]] == [1.0, 1.0, 1.0, 0.0]
    report = nbformat.read(str(out / "report.ipynb"), as_version=4)
    assert [c.source for c in report.cells if c.cell_type == "code"] == ["Say hello (hello)"]
    # the kernel's own session is still the one the next turn uses
    scripted_lm.add("and again", [step("Done.", "SUBMIT(answer='again')")])
    kernel.run("and again")
    history = kernel.run("%fleet history").text()
    assert "my own turn" in history and "(add)" not in history

    bad = kernel.run("%fleet eval")
    assert bad.reply["content"]["status"] == "error" and "usage" in bad.reply["content"]["evalue"]
    assert "whole number" in kernel.run(f"%fleet eval {data} --repeat two").reply["content"]["evalue"]
    assert "no data set at" in kernel.run("%fleet eval nowhere.jsonl").reply["content"]["evalue"]


@pytest.mark.slow
def test_feedback_marks_the_last_turn_and_adds_it_to_a_data_set(
    start_kernel, fleet_env: dict[str, str], scripted_lm, tmp_path: Path
) -> None:
    kernel = start_kernel()
    assert "no turn to mark" in kernel.run("%fleet feedback good").reply["content"]["evalue"]
    scripted_lm.add("capital of Peru", [step("Lima.", "SUBMIT(answer='Lima')")])
    kernel.run("capital of Peru")
    assert "Marked turn" in kernel.run("%fleet feedback bad too short").text()
    assert "marked bad: too short" in kernel.run("%fleet feedback").text()
    data = tmp_path / "marked.jsonl"
    assert "marked bad" in kernel.run(f"%fleet feedback add {data}").reply["content"]["evalue"]
    kernel.run("%fleet feedback good")
    assert "Added turn" in kernel.run(f"%fleet feedback add {data}").text()
    row = json.loads(data.read_text())
    assert (row["task"], row["expected"], row["scorer"]) == ("capital of Peru", "Lima", "exact")
    assert "usage" in kernel.run("%fleet feedback maybe").reply["content"]["evalue"]
    # the mark is in the store, where the API serves it from
    from fleet_kernel.config import load_settings
    from fleet_kernel.store import Store

    async def marks() -> list[tuple[str, str]]:
        store = await Store.open(load_settings(fleet_env).database_url)
        try:
            return [(row.rating, row.note) for row in await store.list_feedback()]
        finally:
            await store.close()

    assert asyncio.run(marks()) == [("good", "")]
