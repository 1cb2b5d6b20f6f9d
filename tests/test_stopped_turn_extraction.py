"""A turn stopped at its deadline or budget ends with its best answer so far, marked as extracted.

dspy.RLM extracts an answer from the steps when it runs out of iterations; Fleet does the same when the turn
reaches its deadline or its token budget, once the steps have produced something, and fails it as before when
they have not. The extraction is one more root request, counted in the turn's usage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from one_turn import one_turn as _turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.store import Store
from fleet_kernel.transcript import render_text
from fleet_kernel.view import TurnView

EXTRACT_KEY = "extract the final outputs now"  # in dspy.RLM's extract prompt only


@pytest.mark.slow
async def test_a_turn_at_its_deadline_ends_with_the_answer_extracted_from_its_steps(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add(EXTRACT_KEY, [{"answer": "42, from the first count"}])
    scripted_lm.add("*", [
        step("Count.", "print('count is 42')"),
        step("Check again slowly.", "import time\ntime.sleep(60)"),
    ])  # fmt: skip
    events = await _turn(store, fleet_env, tmp_path, "count it", "[limits]\nturn_timeout_s = 12\n")
    end = events[-1]
    assert end.type == "turn.completed", end.data
    assert end.data["answer"] == "42, from the first count"
    assert end.data["extracted"] is True and end.data["reason"] == "deadline"
    extract = [b for b in scripted_lm.root_requests() if EXTRACT_KEY in str(b["messages"])]
    assert len(extract) == 1 and "count is 42" in str(extract[0]["messages"])  # extracted from the steps that ran
    assert end.data["usage"]["lm_calls"] == sum(e.type == "lm.finished" for e in events) == 3
    turn = await store.get_turn(end.turn_id)
    assert turn.status == "completed" and turn.extraction_reason == "deadline"
    assert "the turn reached its deadline (limits.turn_timeout_s)" in render_text(TurnView.of(events, turn))


@pytest.mark.slow
async def test_a_turn_at_its_deadline_before_any_step_finished_fails(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add(EXTRACT_KEY, [{"answer": "never asked"}])
    scripted_lm.add("*", [step("Sleep.", "import time\ntime.sleep(60)")])
    events = await _turn(store, fleet_env, tmp_path, "sleep", "[limits]\nturn_timeout_s = 2\n")
    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "deadline_exceeded"
    assert not [b for b in scripted_lm.root_requests() if EXTRACT_KEY in str(b["messages"])]


async def test_a_turn_over_its_budget_ends_with_the_answer_extracted_from_its_steps(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add(EXTRACT_KEY, [{"answer": "about 7, so far"}])
    scripted_lm.default = step("Keep looking.", "print('still looking, 7 so far')")
    toml = "[limits]\nmax_iters = 20\nmax_turn_tokens = 6000\n"
    events = await _turn(store, fleet_env, tmp_path, "look for it", toml)
    end = events[-1]
    assert end.type == "turn.completed", end.data
    assert end.data["answer"] == "about 7, so far" and end.data["extracted"] is True and end.data["reason"] == "budget"
    requests = scripted_lm.root_requests()
    assert EXTRACT_KEY in str(requests[-1]["messages"])  # the one request after the budget was used up
    assert not any(EXTRACT_KEY in str(b["messages"]) for b in requests[:-1])
    assert end.data["usage"]["prompt_tokens"] + end.data["usage"]["completion_tokens"] >= 6000
    turn = await store.get_turn(end.turn_id)
    assert turn.extraction_reason == "budget" and turn.answer == "about 7, so far"


@pytest.mark.slow
async def test_an_extraction_slower_than_the_grace_waits_as_long_as_its_request_may_take(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local model on a busy CPU needs more than 30 s for the extraction's request: the turn waits for it
    as long as ``[lm] request_timeout_s`` allows (the floor is shortened here to keep the test short)."""
    from fleet_kernel.engine import runner

    monkeypatch.setattr(runner, "EXTRACT_GRACE_S", 0.5)
    scripted_lm.add(EXTRACT_KEY, [{"delay": 4, "answer": "42, slowly"}])
    scripted_lm.add("*", [step("Count.", "print('count is 42')"), step("Wait.", "import time\ntime.sleep(60)")])
    config = "[limits]\nturn_timeout_s = 12\n[lm]\nrequest_timeout_s = 30\n"
    end = (await _turn(store, fleet_env, tmp_path, "count it", config))[-1]
    assert end.type == "turn.completed" and end.data["answer"] == "42, slowly", end.data
    assert end.data["extracted"] is True and end.data["reason"] == "deadline"
