"""Tests for what protects the user's money in a turn: the per-call token cap, per-turn budgets, and
LM requests closed when a turn ends. Real turns in the real sandbox; the scripted LM on loopback
records every request body and every client that left before its answer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import ValidationError
from fleet_kernel.events import Event
from fleet_kernel.store import Store

EXTRACT_KEY = "extract the final outputs now"  # dspy.RLM's extract prompt: after a budget, the answer so far


@pytest.fixture
async def make_runner(fleet_env: dict[str, str], tmp_path: Path, store: Store) -> AsyncIterator[Callable[..., Any]]:
    """Build a runner from a ``fleet.toml`` given as text."""
    runners: list[TurnRunner] = []

    async def build(toml: str = "", **env: str) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text(toml)
        runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config), **env})).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def collect(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    return [event async for event in handle.events()]


is_root = ScriptedLM.is_root
MARKER_TASK = "a marker turn after the one under test"


async def requests_after(runner: TurnRunner, store: Store, scripted_lm: ScriptedLM, since: int) -> list[dict[str, Any]]:
    """The LM requests after the first ``since`` that a marker turn, run to its end now, did not make: a turn that
    went on calling its LM after it ended would show there."""
    scripted_lm.add(MARKER_TASK, [step("Done.", "SUBMIT(answer='marked')")])
    session = await store.create_session()
    events = await collect(runner, session.session_id, MARKER_TASK)
    assert events[-1].type == "turn.completed", events[-1].data
    return [body for body in scripted_lm.requests[since:] if MARKER_TASK not in json.dumps(body)]


def cap(body: dict[str, Any]) -> int | None:
    """The completion cap a request asked for, whichever name the client gave it."""
    return body.get("max_tokens", body.get("max_completion_tokens"))


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def test_every_lm_request_carries_its_max_tokens(make_runner, store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("*", [
        step("Ask and delegate.", "a = llm_query('what is 6*7?')\n"
             "r = dspy.RLM('question -> answer', max_iters=2)(question='child-question')\nprint(a, r.answer)"),
        step("Done.", "SUBMIT(answer='done')"),
    ])  # fmt: skip
    scripted_lm.add("child-question", [step("Inner.", "SUBMIT(answer='inner')")])
    runner = await make_runner("[lm]\nmax_tokens = 300\nsub_max_tokens = 200\n")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "ask and delegate")

    assert events[-1].type == "turn.completed", events[-1].data
    limits = events[0].data["limits"]
    assert limits["max_tokens"] == 300 and limits["sub_max_tokens"] == 200
    assert limits["max_turn_tokens"] == 2_000_000 and limits["max_turn_cost_usd"] is None
    turn_task = "Do the user's task for this turn"  # only the turn's own RLM has these instructions
    root = [b for b in scripted_lm.requests if is_root(b) and turn_task in b["messages"][0]["content"]]
    child = [b for b in scripted_lm.requests if is_root(b) and turn_task not in b["messages"][0]["content"]]
    sub = [b for b in scripted_lm.requests if not is_root(b)]
    assert len(root) == 2 and len(sub) == 1 and child
    assert {cap(b) for b in root} == {300}
    assert {cap(b) for b in sub + child} == {200}


async def test_model_code_cannot_raise_the_cap(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Ask for a lot.", "print(dspy.Predict('q -> a')(q='child-question', config={'max_tokens': 100000}).a)"),
        step("Done.", "SUBMIT(answer='done')"),
    ])  # fmt: skip
    scripted_lm.add("child-question", [{"a": "small"}])
    runner = await make_runner("[lm]\nmax_tokens = 300\n")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "ask for a lot")
    assert events[-1].type == "turn.completed", events[-1].data
    assert {cap(b) for b in scripted_lm.requests} == {300}


async def test_token_budget_ends_the_turn_before_its_last_call(make_runner, store, scripted_lm) -> None:
    scripted_lm.default = step("Keep looking.", "print('still looking')")
    runner = await make_runner("[limits]\nmax_iters = 20\nmax_turn_tokens = 6000\n")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "never finish")

    assert events[-1].type == "turn.failed"
    error = events[-1].data["error"]
    assert error["type"] == "budget_exceeded"
    assert "limits.max_turn_tokens" in error["message"] and "6,000" in error["message"]
    calls = len(scripted_lm.requests)
    assert calls == sum(1 for e in events if e.type == "lm.finished")
    # After the budget, only the extraction of an answer from the steps (asked again once: this script never
    # gives one, so the turn fails as before); no step starts.
    steps = [b for b in scripted_lm.requests if EXTRACT_KEY not in json.dumps(b)]
    assert 1 < len(steps) < 20 and calls - len(steps) == 2
    assert EXTRACT_KEY in json.dumps(scripted_lm.requests[-1]) and EXTRACT_KEY in json.dumps(scripted_lm.requests[-2])
    used = int(error["message"].split("used ")[1].split(" LM tokens")[0].replace(",", ""))
    assert used >= 6000
    turn = await store.get_turn(events[0].turn_id)
    assert turn.status == "failed" and turn.error["type"] == "budget_exceeded"
    assert turn.usage["budgets"] == {"max_turn_tokens": 6000, "max_turn_cost_usd": None}
    assert turn.usage["prompt_tokens"] + turn.usage["completion_tokens"] > used  # the extraction counts too
    assert await requests_after(runner, store, scripted_lm, calls) == []


async def test_cost_budget(make_runner, store, scripted_lm) -> None:
    scripted_lm.default = step("Keep looking.", "print('still looking')")
    # A model with a known price, so each call has a cost; the scripted server answers for it.
    runner = await make_runner("[limits]\nmax_turn_cost_usd = 0.002\n", FLEET_LM_MODEL="openai/gpt-4.1-mini")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "never finish")
    assert events[-1].type == "turn.failed", events[-1].data
    error = events[-1].data["error"]
    assert error["type"] == "budget_exceeded" and "limits.max_turn_cost_usd" in error["message"]
    costs = [e.data["cost_usd"] for e in events if e.type == "lm.finished"]
    steps = costs[:-2]  # the last two: the extraction after the budget, asked again once (this script never answers)
    assert all(costs) and sum(steps) >= 0.002 and sum(steps[:-1]) < 0.002
    assert len(scripted_lm.requests) == len(costs) < 20


async def test_a_turn_may_lower_its_limits_but_not_raise_them(make_runner, store, scripted_lm) -> None:
    scripted_lm.default = step("Keep looking.", "print('still looking')")
    runner = await make_runner()
    session = await store.create_session()
    with pytest.raises(ValidationError, match="limits.max_iters may be at most 20"):
        await runner.start(session.session_id, "more", limits={"max_iters": 30})
    with pytest.raises(ValidationError, match="unknown key"):
        await runner.start(session.session_id, "typo", limits={"max_turn_token": 10})
    handle = await runner.start(session.session_id, "never finish", limits={"max_turn_tokens": 3000})
    events = [event async for event in handle.events()]
    assert events[0].data["limits"]["max_turn_tokens"] == 3000
    assert events[-1].data["error"]["type"] == "budget_exceeded" and "3,000" in events[-1].data["error"]["message"]


@pytest.mark.slow
async def test_sub_lm_calls_count_and_stop_the_code(make_runner, store, scripted_lm) -> None:
    scripted_lm.sub = lambda prompt: "x" * 40_000  # about 10,000 completion tokens each
    scripted_lm.add("*", [
        step("Ask many times.", "for i in range(10):\n    llm_query(f'question {i}')\n    print('asked', i, flush=True)"),
        step("Done.", "SUBMIT(answer='done')"),
    ])  # fmt: skip
    runner = await make_runner("[limits]\nmax_turn_tokens = 25000\n")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "ask many times")

    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "budget_exceeded"
    sub_calls = [b for b in scripted_lm.requests if not is_root(b)]
    assert len(sub_calls) == 3  # 10k + 10k + 10k crosses 25k: the fourth never starts
    assert sum(1 for b in scripted_lm.requests if is_root(b)) == 1  # the turn did not go on to another step


@pytest.mark.slow
async def test_cancel_closes_a_slow_lm_request(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [{"delay": 60, "reasoning": "slow", "code": "SUBMIT(answer='late')"}])
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "think slowly")
    await wait_for(lambda: len(scripted_lm.requests) == 1)
    handle.cancel("stopped by the user")
    row = await handle.wait()
    assert row.status == "cancelled"
    await wait_for(lambda: len(scripted_lm.disconnects) == 1)  # the server saw the client leave
    assert await requests_after(runner, store, scripted_lm, 1) == []  # and no retry took its place


@pytest.mark.slow
async def test_deadline_closes_a_slow_lm_request(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [{"delay": 60, "reasoning": "slow", "code": "SUBMIT(answer='late')"}])
    runner = await make_runner("[limits]\nturn_timeout_s = 1\n")
    session = await store.create_session()
    events = await collect(runner, session.session_id, "think slowly")
    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "deadline_exceeded"
    await wait_for(lambda: len(scripted_lm.disconnects) == 1)


async def test_cancel_answers_a_waiting_sub_lm_call(make_runner, store, scripted_lm) -> None:
    scripted_lm.sub = lambda prompt: {"delay": 60, "text": "late"}
    scripted_lm.add("*", [step("Ask.", "print('asking', flush=True)\nprint(llm_query('slow question'))")])
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "ask slowly")
    await wait_for(lambda: any(not is_root(b) for b in scripted_lm.requests))
    started = time.monotonic()
    handle.cancel("stopped by the user")
    row = await handle.wait()
    assert row.status == "cancelled" and time.monotonic() - started < 30  # liveness: the answer takes a minute
    await wait_for(lambda: len(scripted_lm.disconnects) == 1)
    assert not is_root(scripted_lm.disconnects[0])


async def test_a_cap_too_low_for_the_model_says_what_to_set(make_runner, store, scripted_lm) -> None:
    runner = await make_runner(FLEET_LM_MODEL="openai/gpt-5-mini")  # OpenAI reasoning models need >= 16000
    session = await store.create_session()
    events = await collect(runner, session.session_id, "hello")
    assert events[-1].type == "turn.failed"
    assert events[-1].data["error"]["type"] == "lm_configuration"
    assert "[lm] max_tokens = 4096" in events[-1].data["error"]["message"]
    assert not scripted_lm.requests
    scripted_lm.add("*", [step("Done.", "SUBMIT(answer='ok')")])
    runner = await make_runner("[lm]\nmax_tokens = 16000\n", FLEET_LM_MODEL="openai/gpt-5-mini")
    events = await collect(runner, session.session_id, "hello again")
    assert events[-1].type == "turn.completed", events[-1].data
    assert {cap(b) for b in scripted_lm.requests} == {16000}


@pytest.mark.slow
async def test_crossing_the_budget_closes_the_other_calls_in_flight(make_runner, store, scripted_lm) -> None:
    def sub(prompt: str) -> dict[str, Any]:
        if "big" in prompt:
            return {"delay": 1, "text": "x" * 100_000}  # about 25,000 tokens, after the others were sent
        return {"delay": 60, "text": "late"}

    scripted_lm.sub = sub
    scripted_lm.add("*", [step("Ask at once.", "print(llm_query_batched(['big', 'slow one', 'slow two']))")])
    runner = await make_runner("[limits]\nmax_turn_tokens = 20000\n")
    session = await store.create_session()
    started = time.monotonic()
    events = await collect(runner, session.session_id, "ask at once")
    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "budget_exceeded"
    assert time.monotonic() - started < 30  # well before the slow answers would come
    # the slow ones are closed; the big reply's stream is cut too, once it would pass the budget
    await wait_for(lambda: sum("slow" in json.dumps(b) for b in scripted_lm.disconnects) == 2)
