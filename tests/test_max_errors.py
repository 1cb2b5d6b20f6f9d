"""``[limits] max_errors``: a turn whose code fails that many steps in a row stops, saying which key and why."""

from __future__ import annotations

from pathlib import Path

import pytest
from one_turn import one_turn as _turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.store import Store

BROKEN = step("Parse it.", "import json\njson.loads('{not json')")


async def test_code_failing_n_steps_in_a_row_stops_the_turn(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.default = BROKEN
    events = await _turn(store, fleet_env, tmp_path, "parse the data", "[limits]\nmax_errors = 3\nmax_iters = 10\n")
    assert events[0].data["limits"]["max_errors"] == 3
    end = events[-1]
    assert end.type == "turn.failed", end.data
    error = end.data["error"]
    assert error["type"] == "too_many_errors"
    assert "failed 3 steps in a row" in error["message"] and "limits.max_errors = 3" in error["message"]
    assert "JSONDecodeError" in error["message"]  # the last error, quoted
    finished = [e.data for e in events if e.type == "execution.finished"]
    assert len(finished) == 3 and all(d["error"] for d in finished)
    assert len(scripted_lm.root_requests()) == 3  # no step was asked for after the third failure
    turn = await store.get_turn(end.turn_id)
    assert turn.status == "failed" and turn.error["type"] == "too_many_errors"


async def test_a_failure_at_the_last_iteration_leaves_the_turn_to_its_extraction(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    """With ``max_errors`` at ``max_iters`` (the default 5 and 5), the last step's failure must not stop the
    turn: dspy.RLM extracts an answer after its last iteration, as raw dspy.RLM does (Qwen2.5-Coder-1.5B's
    kernel runs failed five steps in a row and ended with no answer, where raw's gave one)."""
    scripted_lm.default = BROKEN
    scripted_lm.add("extract the final outputs now", [{"answer": "a best guess"}])  # dspy.RLM's extract prompt
    events = await _turn(store, fleet_env, tmp_path, "parse the data", "[limits]\nmax_errors = 3\nmax_iters = 3\n")
    end = events[-1]
    assert end.type == "turn.completed", end.data
    assert end.data["answer"] == "a best guess" and end.data["extracted"] and end.data["reason"] == "max_iters"


async def test_a_step_that_works_resets_the_count(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    fixed = step("Fix it.", "print('fine')")
    scripted_lm.add("*", [BROKEN, BROKEN, fixed, BROKEN, BROKEN, step("Done.", "SUBMIT(answer='parsed')")])
    events = await _turn(store, fleet_env, tmp_path, "parse the data", "[limits]\nmax_errors = 3\n")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "parsed", events[-1].data


async def test_a_file_not_found_under_workspace_slash_says_where_the_working_directory_is(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [step("Read it.", "open('workspace/files/sales.csv')"), step("Done.", "SUBMIT(answer='ok')")])
    events = await _turn(store, fleet_env, tmp_path, "read the file")
    assert events[-1].type == "turn.completed", events[-1].data
    seen = "".join(str(m["content"]) for m in scripted_lm.root_requests()[1]["messages"])
    assert "No such file or directory: 'workspace/files/sales.csv'" in seen, seen[-1500:]
    assert "write '/workspace/files/sales.csv' or 'files/sales.csv'" in seen


async def test_a_path_built_on_the_workspace_listing_is_told_it_is_a_listing(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    """Qwen2.5-Coder-1.5B opened ``workspace + '/files/app.log'``: the ``workspace`` input is a listing."""
    from fleet_kernel.workspace import MANIFEST_HEADING

    listing = f"{MANIFEST_HEADING}\n  files/app.log  (12 bytes)\n  Save plots under /workspace/artifacts/ for the user."
    code = f"workspace = {listing!r}\nopen(workspace + '/files/app.log')"
    scripted_lm.add("*", [step("Read it.", code), step("Done.", "SUBMIT(answer='ok')")])
    events = await _turn(store, fleet_env, tmp_path, "count the lines")
    assert events[-1].type == "turn.completed", events[-1].data
    seen = "".join(str(m["content"]) for m in scripted_lm.root_requests()[1]["messages"])
    assert "(`workspace` is a listing of the folder, not its path: write '/workspace/files/app.log'.)" in seen


@pytest.mark.parametrize(
    ("line", "told"),
    [
        (
            "from dspy import llm_query",
            "(llm_query is already defined in the sandbox: call it as it is, with no import.)",
        ),
        (
            "from fleet import (SUBMIT,\n  llm_query)",
            "(SUBMIT, llm_query are already defined in the sandbox: call them as",
        ),
    ],
)
async def test_importing_a_name_the_sandbox_provides_is_told_it_needs_no_import(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path, line: str, told: str
) -> None:
    """Qwen2.5-Coder-1.5B wrote ``from dspy import llm_query`` five steps running: the function is already
    there, and the error alone did not tell it so."""
    scripted_lm.add("*", [step("Ask.", f"{line}\nprint(llm_query('hi'))"), step("Done.", "SUBMIT(answer='ok')")])
    events = await _turn(store, fleet_env, tmp_path, "classify the reviews")
    assert events[-1].type == "turn.completed", events[-1].data
    seen = "".join(str(m["content"]) for m in scripted_lm.root_requests()[1]["messages"])
    assert told in seen, seen[-1500:]
