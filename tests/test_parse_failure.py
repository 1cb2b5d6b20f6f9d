"""A model reply that cannot be parsed: the turn says what the model said, and why it may have stopped."""

from __future__ import annotations

from pathlib import Path

from one_turn import one_turn as _turn
from scripted_lm import ScriptedLM

from fleet_kernel.store import Store

CUT_REPLY = "[[ ## reasoning ## ]]\nFirst I will read data/sales.csv and sum the units by region, then"


async def test_a_reply_cut_at_max_tokens_shows_what_the_model_said_and_the_key(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.default = {"raw": CUT_REPLY, "finish_reason": "length"}
    events = await _turn(store, fleet_env, tmp_path, "sum the sales by region", "[lm]\nmax_tokens = 64\n")
    end = events[-1]
    assert end.type == "turn.failed", end.data
    error = end.data["error"]
    assert error["type"] == "lm_parse_error"
    message = error["message"]
    assert "sum the units by region" in message  # what the model said
    assert "[lm] max_tokens" in message and "64" in message  # where it was cut, and the key that raises it
    assert len(message) <= 2000
    finished = [e.data for e in events if e.type == "lm.finished"]
    assert finished and all(d["finish_reason"] == "length" for d in finished)


async def test_an_unparseable_complete_reply_is_shown_bounded(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    rambling = "I think the answer is in the data. " * 200
    scripted_lm.default = {"raw": rambling}
    events = await _turn(store, fleet_env, tmp_path, "what is in the data?")
    end = events[-1]
    assert end.type == "turn.failed" and end.data["error"]["type"] == "lm_parse_error", end.data
    message = end.data["error"]["message"]
    assert "I think the answer is in the data." in message and "more characters" in message
    assert "max_tokens" not in message and len(message) <= 2000
    assert {e.data["finish_reason"] for e in events if e.type == "lm.finished"} == {"stop"}


async def test_a_turn_without_a_model_reports_its_lm_step_as_not_sent(
    store: Store, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in fleet_env.items() if not k.startswith("FLEET_LM_")}
    events = await _turn(store, env, tmp_path, "anything")
    assert events[-1].type == "turn.failed"
    assert [e.data["finish_reason"] for e in events if e.type == "lm.finished"] == ["not_sent"]


async def test_an_unparseable_reply_is_asked_again_once_with_the_error(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [
        {"raw": "Sure! I will count the lines with Python."},
        {"reasoning": "Count them.", "code": "SUBMIT(answer='3 lines')"},
    ])  # fmt: skip
    events = await _turn(store, fleet_env, tmp_path, "count the lines")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "3 lines", events[-1].data
    first, again = scripted_lm.root_requests()
    messages = again["messages"]
    assert messages[: len(first["messages"])] == first["messages"]  # the same question, then the correction
    assert messages[-2] == {"role": "assistant", "content": "Sure! I will count the lines with Python."}
    correction = messages[-1]["content"]
    assert "could not be parsed" in correction and "`reasoning`, `code`" in correction  # the error
    assert "[[ ## reasoning ## ]]" in correction and "[[ ## completed ## ]]" in correction  # the expected format


async def test_a_reply_unparseable_twice_fails_after_one_retry(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.default = {"raw": "Sure! I will count the lines with Python."}
    events = await _turn(store, fleet_env, tmp_path, "count the lines")
    end = events[-1]
    assert end.type == "turn.failed" and end.data["error"]["type"] == "lm_parse_error", end.data
    assert "also when asked again" in end.data["error"]["message"]
    assert len(scripted_lm.root_requests()) == 2
