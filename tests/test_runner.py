"""Tests for fleet_kernel.engine.TurnRunner: real dspy.RLM turns in the real sandbox, scripted LM on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, step
from sqlalchemy import update

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import Event, make_event
from fleet_kernel.sandbox import probe_bwrap
from fleet_kernel.store import Store, TurnRow
from fleet_kernel.transcript import render_html, render_markdown, render_text
from fleet_kernel.view import TurnView

SECRET = "sk-scripted-test-key"


@pytest.fixture
async def make_runner(fleet_env: dict[str, str], tmp_path: Path, store: Store) -> AsyncIterator[Callable[..., Any]]:
    """Build a runner with ``fleet.toml`` limits and environment overrides."""
    runners: list[TurnRunner] = []

    async def build(env: dict[str, str] | None = None, **limits: Any) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text("[limits]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in limits.items()))
        settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config), **(env or {})})
        runner = await TurnRunner(store, settings).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def collect(runner: TurnRunner, session_id: str, task: str, **kw: Any) -> list[Event]:
    handle = await runner.start(session_id, task, **kw)
    return [event async for event in handle.events()]


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


async def test_turn_streams_every_step_and_commits(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("*", [
        step("Look at the task first.", "print('task has', len(task), 'chars')\nanswer = llm_query('what is 6*7?')\nprint(answer)"),
        step("Done.", "SUBMIT(answer='42')"),
    ])  # fmt: skip
    asked = "local" if probe_bwrap() is None else "pyodide"  # the backend this machine can run; never a fallback
    runner = await make_runner({"FLEET_SANDBOX": asked})
    session = await store.create_session()
    events = await collect(runner, session.session_id, "What is six times seven?")

    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "turn.started" and events[0].data["sandbox"] == asked
    assert types(events)[-1] == "turn.completed" and events[-1].data["answer"] == "42"
    seq = types(events)
    for expected in ("iteration.started", "reasoning", "code", "output", "execution.finished", "lm.finished",
                     "tool.started", "tool.finished"):  # fmt: skip
        assert expected in seq, expected
    outputs = "".join(e.data["text"] for e in events if e.type == "output")
    assert "task has 24 chars" in outputs and "sub-answer: what is 6*7?" in outputs
    assert {e.data["role"] for e in events if e.type == "lm.finished"} == {"root", "sub"}
    tool = next(e for e in events if e.type == "tool.started")
    assert tool.data["name"] == "llm_query"
    usage = events[-1].data["usage"]
    assert usage["lm_calls"] == 3 and usage["prompt_tokens"] > 0

    turn = await store.get_turn(events[0].turn_id)
    assert turn.status == "completed" and turn.answer == "42" and turn.usage["lm_calls"] == 3
    stored = await store.events_after(turn.turn_id)
    assert [e.model_dump() for e in stored] == [e.model_dump() for e in events]


async def test_output_streams_while_code_runs(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("*", [
        step("Count slowly.", "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "tick")
    arrivals: list[tuple[float, Event]] = []
    async for event in handle.events():
        arrivals.append((time.perf_counter(), event))
    first_output = next(t for t, e in arrivals if e.type == "output")
    finished = next(t for t, e in arrivals if e.type == "execution.finished")
    assert finished - first_output > 0.5  # the first tick arrived while the code still ran


async def test_history_feeds_the_next_turn(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("*", [step("a", "SUBMIT(answer='column A sums to 10')"), step("b", "SUBMIT(answer='B')")])
    runner = await make_runner()
    session = await store.create_session()
    await collect(runner, session.session_id, "sum column A")
    await collect(runner, session.session_id, "now do the same for column B")
    last_request = json.dumps(scripted_lm.requests[-1])
    assert "sum column A" in last_request and "column A sums to 10" in last_request


async def test_no_model_configured(make_runner, store: Store) -> None:
    runner = await make_runner(env={"FLEET_LM_MODEL": ""})
    session = await store.create_session()
    events = await collect(runner, session.session_id, "hello")
    assert types(events) == ["turn.started", "lm.finished", "turn.failed"]
    assert "FLEET_LM_MODEL" in events[-1].data["error"]["message"]
    assert (await store.get_turn(events[0].turn_id)).status == "failed"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "env", "expect"),
    [
        ([{"status": 401, "error": f"invalid api key {SECRET}"}], {}, "FLEET_LM_API_KEY"),
        ([{"status": 500, "error": "upstream exploded"}] * 4, {}, "failed"),
        ([], {"FLEET_LM_BASE_URL": "http://127.0.0.1:9/v1"}, "FLEET_LM_BASE_URL"),
    ],
    ids=["bad-key", "provider-error", "connection-refused"],
)
async def test_lm_failures_say_what_to_check(make_runner, store, scripted_lm, script, env, expect) -> None:
    scripted_lm.add("*", script)
    runner = await make_runner(env=env)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "hello")
    assert events[-1].type == "turn.failed"
    message = events[-1].data["error"]["message"]
    assert expect in message
    assert SECRET not in json.dumps([e.model_dump() for e in events])
    assert "lm.finished" in types(events)


async def test_execution_timeout_is_recoverable(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Set state, then loop.", "x = 41\nwhile True:\n    pass"),
        step("Recover.", "SUBMIT(answer=str(x + 1))"),
    ])  # fmt: skip
    runner = await make_runner(exec_timeout_s=1)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "loop")
    finished = [e for e in events if e.type == "execution.finished"]
    assert finished[0].data["error"] and "timed out" in finished[0].data["error"]["message"]
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "42"


async def test_cancel_stops_running_code(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [step("Sleep.", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "sleep")
    cancelled_at = None
    events = []
    async for event in handle.events():
        events.append(event)
        if event.type == "output" and cancelled_at is None:
            cancelled_at = time.perf_counter()
            handle.cancel("stopped by the user")
    assert events[-1].type == "turn.cancelled" and events[-1].data["reason"] == "stopped by the user"
    assert time.perf_counter() - cancelled_at < 30  # liveness: the code sleeps for a minute
    assert (await store.get_turn(handle.turn_id)).status == "cancelled"

    scripted_lm.add("*", [step("Again.", "SUBMIT(answer='fine')")])
    events = await collect(runner, session.session_id, "still alive?")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "fine"


async def test_durable_cancellation_from_the_store(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [step("Sleep.", "import time\ntime.sleep(60)")])
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "sleep")
    await asyncio.sleep(0.5)
    _, state = await store.request_cancel(handle.run_id, "cancelled over HTTP")
    assert state == "requested"
    started = time.perf_counter()
    row = await handle.wait()
    assert row.status == "cancelled" and time.perf_counter() - started < 30  # liveness: the code sleeps for a minute


async def test_turn_deadline(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [step("Sleep.", "import time\ntime.sleep(60)")])
    runner = await make_runner(turn_timeout_s=1)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "sleep")
    assert events[-1].type == "turn.failed"
    assert events[-1].data["error"]["type"] == "deadline_exceeded"
    assert "limits.turn_timeout_s" in events[-1].data["error"]["message"]


async def test_idempotent_start_never_runs_twice(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [step("Once.", "SUBMIT(answer='once')")])
    runner = await make_runner()
    session = await store.create_session()
    first = await collect(runner, session.session_id, "once", idempotency_key="key-1")
    again = await runner.start(session.session_id, "once", idempotency_key="key-1")
    assert not again.created and again.turn_id == first[0].turn_id
    assert [e.model_dump() for e in [e async for e in again.events()]] == [e.model_dump() for e in first]
    assert len(scripted_lm.root_requests()) == 1


async def test_max_iters_falls_back_to_extract(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [step("Explore.", "print('hm')"), {"answer": "extracted guess"}])
    runner = await make_runner(max_iters=1)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "hard question")
    assert events[-1].type == "turn.completed"
    assert events[-1].data["answer"] == "extracted guess" and events[-1].data["extracted"] is True
    assert events[-1].data["reason"] == "max_iters"
    turn = await store.get_turn(events[0].turn_id)
    assert turn.extraction_reason == "max_iters"
    view = TurnView.of(events, turn)
    note = "the turn reached its iteration limit (1, limits.max_iters) before the model called SUBMIT"
    assert note in render_text(view) and note in render_html(view)
    assert "extracted from the steps so far" in render_markdown(view)


async def test_child_rlm_is_an_agent(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Delegate.", "r = dspy.RLM('question -> answer', max_iters=2)(question='child-question')\nprint(r.answer)"),
        step("Done.", "SUBMIT(answer='child said ' + r.answer)"),
    ])  # fmt: skip
    scripted_lm.add("child-question", [step("Inner.", "SUBMIT(answer='inner')")])
    runner = await make_runner()
    session = await store.create_session()
    events = await collect(runner, session.session_id, "delegate")
    assert events[-1].type == "turn.completed", events[-1].data
    assert events[-1].data["answer"] == "child said inner"
    started = next(e for e in events if e.type == "agent.started")
    assert started.data["depth"] == 1 and started.data["parent_agent_id"] == "root"
    child = started.data["agent_id"]
    assert any(e.agent_id == child and e.type == "code" for e in events)
    assert any(e.type == "agent.finished" and e.data == {"agent_id": child, "ok": True} for e in events)
    # the child's LM call and execution are its own, and every LM request shows once
    assert [e.data["role"] for e in events if e.type == "lm.finished" and e.agent_id == child] == ["sub"]
    assert [e.data["iteration"] for e in events if e.type == "execution.finished" and e.agent_id == child] == [1]
    assert sum(e.type == "lm.finished" for e in events) == len(scripted_lm.requests) == 3
    assert [e.data["iteration"] for e in events if e.type == "execution.finished" and e.agent_id == "root"] == [1, 2]


async def test_child_limit_is_an_error_the_model_sees(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Delegate.", "try:\n    dspy.RLM('question -> answer')(question='child-question')\nexcept Exception as e:\n    print('refused:', e)"),
        step("Done.", "SUBMIT(answer='handled')"),
    ])  # fmt: skip
    runner = await make_runner(max_children=0)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "delegate")
    outputs = "".join(e.data["text"] for e in events if e.type == "output")
    assert "limits.max_children" in outputs
    assert events[-1].type == "turn.completed"


async def test_artifacts_are_committed(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Write.", "open('/workspace/artifacts/table.csv', 'w').write('a,b\\n1,2\\n')"),
        step("Done.", "SUBMIT(answer='saved')"),
    ])  # fmt: skip
    runner = await make_runner()
    session = await store.create_session()
    events = await collect(runner, session.session_id, "save a table")
    artifact = next(e for e in events if e.type == "artifact")
    assert artifact.data["path"] == "artifacts/table.csv" and artifact.data["mime"] == "text/csv"
    assert await store.get_blob(artifact.data["sha256"]) == b"a,b\n1,2\n"
    assert types(events).index("artifact") < types(events).index("turn.completed")


async def test_key_never_reaches_sandbox_events_or_store(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [
        step("Snoop.", "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ','rb').read())"),
        step("Leak?", f"SUBMIT(answer='{SECRET[:6]}' + '{SECRET[6:]}')"),
    ])  # fmt: skip
    runner = await make_runner()
    session = await store.create_session()
    events = await collect(runner, session.session_id, "snoop")
    dumped = json.dumps([e.model_dump() for e in events])
    assert SECRET not in dumped
    turn = await store.get_turn(events[0].turn_id)
    assert SECRET not in json.dumps(turn.to_dict())


async def _read_all(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


async def _abandon(store: Store, session_id: str, seqs: int) -> str:
    """A running turn with ``seqs`` stored events whose owner is a real Fleet process that has exited."""
    code = "from fleet_kernel.store import PROCESS_OWNER; print(PROCESS_OWNER)"
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    turn, _ = await store.claim_turn(session_id, "left running by a killed process")
    events = [make_event("output", {"iteration": 1, "stream": "stdout", "text": "x"}, seq=i, session_id=session_id,
                         turn_id=turn.turn_id) for i in range(1, seqs + 1)]  # fmt: skip
    await store.append_events(events)
    async with store.engine.begin() as conn:
        await conn.execute(update(TurnRow).where(TurnRow.turn_id == turn.turn_id).values(owner=done.stdout.strip()))
    return turn.turn_id


@pytest.mark.slow
async def test_a_new_turn_takes_over_a_dead_owner_s_session_and_ends_its_stream(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [step("Done.", "SUBMIT(answer='ok')")])
    runner = await make_runner()
    session = await store.create_session()
    old = await _abandon(store, session.session_id, seqs=2)
    watcher = runner.hub.subscribe(old)  # a watcher of the dead turn in this process

    events = await collect(runner, session.session_id, "the next turn")

    assert types(events)[0] == "turn.started" and types(events)[-1] == "turn.completed"
    ended = await asyncio.wait_for(watcher.get(), 10)
    assert (ended.seq, ended.type, ended.data["error"]["type"]) == (3, "turn.failed", "interrupted")
    stored = await store.events_after(old)
    assert [(e.seq, e.type) for e in stored] == [(1, "output"), (2, "output"), (3, "turn.failed")]
    assert stored[-1].model_dump() == ended.model_dump()
    assert (await store.get_turn(old)).status == "interrupted"


@pytest.mark.slow
async def test_two_processes_reaping_one_turn_end_it_once(make_runner, store: Store, settings, scripted_lm) -> None:
    other_store = await Store.open(settings.database_url)
    try:
        runner = await make_runner()
        other = await TurnRunner(other_store, settings).open()
        session = await store.create_session()
        old = await _abandon(store, session.session_id, seqs=1)
        rounds = await asyncio.gather(*(r.reap() for r in (runner, other) * 3))
        assert [t.turn_id for t in (t for turns in rounds for t in turns)] == [old]
        await other.close()  # its writer has committed what it was given
        followed = await asyncio.wait_for(_read_all(runner.follow(old)), 10)  # up to the terminal event
        assert [(e.seq, e.type) for e in followed] == [(1, "output"), (2, "turn.failed")]
        assert [(e.seq, e.type) for e in await store.events_after(old)] == [(1, "output"), (2, "turn.failed")]
    finally:
        await other_store.close()


async def test_turns_leave_nothing_behind_in_dspy_s_process_wide_records(make_runner, store, scripted_lm) -> None:
    # dspy keeps every predictor call (global trace) and every LM call (global history) unless told
    # otherwise: a kernel or server running turn after turn would keep every turn's prompts alive
    import dspy
    from dspy.clients.base_lm import GLOBAL_HISTORY

    trace, history = len(dspy.settings.trace), len(GLOBAL_HISTORY)
    scripted_lm.add("*", [step("Look.", "print(1)"), step("Done.", "SUBMIT(answer='ok')")] * 2)
    runner = await make_runner()
    session = await store.create_session()
    for task in ("first", "second"):
        assert (await collect(runner, session.session_id, task))[-1].type == "turn.completed"
    assert (len(dspy.settings.trace), len(GLOBAL_HISTORY)) == (trace, history)


async def test_turns_started_at_once_all_say_so_before_any_starts_up(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of requests: each turn's heavy start-up (history, workspace, dspy, sandbox) waits for the
    others' ``turn.started``, so none of them waits for its first event behind the others' start-ups. One start
    is made slow (its catalogue and sandbox choice take 1.5 s, longer than the quick turn's start-up once dspy
    is loaded): the quick turn's next event comes after it."""
    from fleet_kernel.engine import runner as runner_module

    monkeypatch.setattr(runner_module, "ANNOUNCE_WAIT_S", 60.0)  # the order is tested, not the cap on the wait
    quick, slow = (await store.create_session()).session_id, (await store.create_session()).session_id
    scripted_lm.add("warm-up", [step("Answer.", "SUBMIT(answer='warm')")])
    await runner.run(quick, "warm-up")  # dspy and the sandbox loaded: a start-up takes tens of milliseconds
    before_claim = TurnRunner._before_claim

    def slow_before_claim(self: TurnRunner, settings: Any, session_id: str, *rest: Any) -> Any:
        if session_id == slow:
            time.sleep(1.5)
        return before_claim(self, settings, session_id, *rest)

    monkeypatch.setattr(TurnRunner, "_before_claim", slow_before_claim)
    for task in ("quick", "slow"):
        scripted_lm.add(task, [step("Answer.", f"SUBMIT(answer='{task}')")])
    handles = await asyncio.gather(runner.start(quick, "quick"), runner.start(slow, "slow"))
    quick_events, slow_events = [[e async for e in handle.events()] for handle in handles]
    assert quick_events[-1].type == slow_events[-1].type == "turn.completed"
    assert slow_events[0].type == "turn.started"
    assert quick_events[1].ts >= slow_events[0].ts, (quick_events[1].type, quick_events[1].ts, slow_events[0].ts)
