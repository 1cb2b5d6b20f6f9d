"""Turns exported as OpenTelemetry traces over OTLP/HTTP: real runner, real sandbox, scripted LM, and a
loopback collector that decodes what arrives with opentelemetry-proto."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import pytest
from otlp_receiver import OTLPReceiver, Span
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import Event
from fleet_kernel.store import Store

SECRET = "sk-scripted-test-key"


@pytest.fixture
async def make_runner(
    fleet_env: dict[str, str], store: Store, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    """A runner whose traces go to ``endpoint`` (the SDK reads the OTEL_* variables from the environment)."""
    runners: list[TurnRunner] = []

    async def build(endpoint: str, **env: str) -> TurnRunner:
        otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50",
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2", "OTEL_SERVICE_NAME": "fleet-test", **env}  # fmt: skip
        for name, value in otel.items():
            monkeypatch.setenv(name, value)
        settings = load_settings({**fleet_env, **otel})
        assert settings.tracing
        runner = await TurnRunner(store, settings).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def collect(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    return [event async for event in handle.events()]


def by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id]


def script_with_everything(lm: ScriptedLM) -> None:
    lm.add("delegate and fail", [
        step("Ask and delegate.", "a = llm_query('what is 6*7?')\n"
             "r = dspy.RLM('question -> answer', max_iters=2)(question='child-question')\nprint(a, r.answer)"),
        step("Break.", "raise ValueError('on purpose')"),
        step("Done.", "SUBMIT(answer='done')"),
    ])  # fmt: skip
    lm.add("child-question", [step("Inner.", "SUBMIT(answer='inner')")])


def turn_done(turn_id: str) -> Callable[[list[Span]], bool]:
    return lambda spans: any(s.name == "fleet.turn" and s.attributes.get("fleet.turn_id") == turn_id for s in spans)


async def test_a_turn_is_one_trace_with_iterations_lm_calls_tools_and_children(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    script_with_everything(scripted_lm)
    with OTLPReceiver() as collector:
        runner = await make_runner(collector.endpoint)
        session = await store.create_session()
        events = await collect(runner, session.session_id, "delegate and fail")
        assert events[-1].type == "turn.completed", events[-1].data
        spans = collector.wait_for(turn_done(events[0].turn_id))

    (root,) = by_name(spans, "fleet.turn")
    assert root.parent_id == "" and {s.trace_id for s in spans} == {root.trace_id}
    assert root.resource["service.name"] == "fleet-test"
    attrs = root.attributes
    assert attrs["fleet.session_id"] == session.session_id and attrs["fleet.turn_id"] == events[0].turn_id
    assert attrs["fleet.run_id"] == events[0].data["run_id"] and attrs["fleet.sandbox"] == events[0].data["sandbox"]
    assert attrs["gen_ai.request.model"] == "openai/scripted" and attrs["gen_ai.operation.name"] == "invoke_agent"
    usage = events[-1].data["usage"]
    assert attrs["fleet.status"] == "completed" and attrs["fleet.usage.lm_calls"] == usage["lm_calls"]
    assert attrs["fleet.usage.prompt_tokens"] == usage["prompt_tokens"] > 0
    assert root.status_code != 2

    iterations = children(spans, root)
    assert [s.name for s in iterations] == ["fleet.iteration"] * 3
    assert sorted(s.attributes["fleet.iteration"] for s in iterations) == [1, 2, 3]
    first, second, _ = sorted(iterations, key=lambda s: s.attributes["fleet.iteration"])
    for iteration in iterations:  # each root step asked the model once, under its iteration
        (chat,) = [s for s in children(spans, iteration) if s.name.startswith("chat ")]
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == "openai/scripted"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0 and chat.attributes["fleet.lm.role"] == "root"
        assert "gen_ai.usage.output_tokens" in chat.attributes and chat.start_ns <= chat.end_ns

    (execution,) = by_name(children(spans, first), "fleet.execute_code")
    assert execution.status_code != 2 and execution.attributes["fleet.duration_ms"] > 0
    (tool,) = [s for s in children(spans, execution) if s.name == "execute_tool llm_query"]
    assert tool.attributes["gen_ai.tool.name"] == "llm_query"
    (sub,) = children(spans, tool)
    assert sub.name.startswith("chat ") and sub.attributes["fleet.lm.role"] == "sub"
    (child,) = [s for s in children(spans, execution) if s.name.startswith("invoke_agent ")]
    assert child.attributes["fleet.depth"] == 1
    (child_iteration,) = children(spans, child)
    assert child_iteration.name == "fleet.iteration" and child_iteration.attributes["fleet.agent_id"] != "root"
    assert any(s.name.startswith("chat ") for s in children(spans, child_iteration))

    (failed_run,) = by_name(children(spans, second), "fleet.execute_code")
    assert failed_run.status_code == 2 and "on purpose" in failed_run.status_message
    (finished,) = [e for e in events if e.type == "execution.finished" and e.data["error"]]
    assert failed_run.attributes["error.type"] == finished.data["error"]["type"]

    # Without FLEET_TRACE_CONTENT, no prompt or output travels; a secret never does.
    for span in spans:
        assert not {"fleet.task", "fleet.code", "fleet.answer", "fleet.output"} & set(span.attributes), span.name
    assert not any(SECRET.encode() in body for body in collector.bodies)
    assert not any(b"delegate and fail" in body for body in collector.bodies)


@pytest.mark.slow
async def test_failed_turn_has_error_status_and_content_only_when_asked(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("first", [step("Print.", f"print('hello', {SECRET!r})"), step("Done.", "SUBMIT(answer='ok')")])
    # "second" has no script: the scripted LM answers HTTP 500 and the turn fails.
    with OTLPReceiver() as collector:
        runner = await make_runner(collector.endpoint, FLEET_TRACE_CONTENT="1")
        session = await store.create_session()
        ok = await collect(runner, session.session_id, "first task")
        failed = await collect(runner, session.session_id, "second task")
        assert ok[-1].type == "turn.completed" and failed[-1].type == "turn.failed"
        spans = collector.wait_for(lambda s: turn_done(ok[0].turn_id)(s) and turn_done(failed[0].turn_id)(s))

    roots = {s.attributes["fleet.turn_id"]: s for s in by_name(spans, "fleet.turn")}
    good, bad = roots[ok[0].turn_id], roots[failed[0].turn_id]
    assert good.trace_id != bad.trace_id
    assert bad.status_code == 2 and bad.attributes["fleet.status"] == "failed"
    assert bad.status_message == failed[-1].data["error"]["message"]
    assert good.attributes["fleet.task"] == "first task" and good.attributes["fleet.answer"] == "ok"
    runs = [s for s in by_name(spans, "fleet.execute_code") if s.trace_id == good.trace_id]
    assert any("print('hello'" in s.attributes.get("fleet.code", "") for s in runs)
    assert any("hello" in s.attributes.get("fleet.output", "") for s in runs)
    assert not any(SECRET.encode() in body for body in collector.bodies)


def _dead_endpoint() -> str:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["dead", "slow"])
async def test_an_unreachable_or_slow_collector_never_touches_the_turn(
    make_runner, store: Store, scripted_lm: ScriptedLM, collector: str
) -> None:
    from fleet_kernel.telemetry import metrics

    scripted_lm.add("*", [step("Print.", "print(6 * 7)"), step("Done.", "SUBMIT(answer='42')")] * 2)
    with OTLPReceiver(delay_s=30) as slow:
        endpoint = _dead_endpoint() if collector == "dead" else slow.endpoint
        runner = await make_runner(endpoint)
        session = await store.create_session()
        lost_before = metrics.SPANS_LOST._value.get()
        events = await collect(runner, session.session_id, "six times seven")
        second = await collect(runner, session.session_id, "again")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "42"
    assert second[-1].type == "turn.completed"
    stored = await store.events_after(events[0].turn_id)
    assert [e.model_dump() for e in stored] == [e.model_dump() for e in events]
    if collector == "dead":  # the lost spans are counted once the exporter gives up
        await runner.close()
        assert metrics.SPANS_LOST._value.get() > lost_before


@pytest.mark.slow
async def test_fleet_trace_export_sends_stored_turns(
    fleet_env: dict[str, str], settings, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [step("Print.", "print(6 * 7)"), step("Done.", "SUBMIT(answer='42')")] * 2)
    runner = await TurnRunner(store, settings).open()  # no endpoint: nothing traced live
    assert not settings.tracing
    session = await store.create_session()
    first = await collect(runner, session.session_id, "one")
    second = await collect(runner, session.session_id, "two")
    await runner.close()

    def fleet(*args: str, endpoint: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **fleet_env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}
        command = [sys.executable, "-m", "fleet_kernel.cli", "trace", "export", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    with OTLPReceiver() as collector:
        done = await asyncio.to_thread(fleet, first[0].turn_id, endpoint=collector.endpoint)
        assert done.returncode == 0, done.stderr
        assert "Exported 1 turn(s)" in done.stdout
        spans = collector.wait_for(turn_done(first[0].turn_id))
        (root,) = by_name(spans, "fleet.turn")
        assert root.attributes["fleet.status"] == "completed"
        assert len(by_name(spans, "fleet.iteration")) == 2 and by_name(spans, "fleet.execute_code")
        start = datetime.fromisoformat(first[0].ts).timestamp() * 1e9
        assert abs(root.start_ns - start) < 2e6  # the turn's own time, not the export's

        done = await asyncio.to_thread(fleet, "--session", session.session_id, endpoint=collector.endpoint)
        assert done.returncode == 0 and "Exported 2 turn(s)" in done.stdout, done.stderr
        collector.wait_for(lambda s: len(by_name(s, "fleet.turn")) == 3 and turn_done(second[0].turn_id)(s))

    dead = await asyncio.to_thread(fleet, first[0].turn_id, endpoint=_dead_endpoint())
    assert dead.returncode == 1 and "did not take" in dead.stderr and "Traceback" not in dead.stderr
    unknown = await asyncio.to_thread(fleet, "no-such-turn", endpoint=_dead_endpoint())
    assert unknown.returncode == 1 and "no turn 'no-such-turn'" in unknown.stderr


@pytest.mark.slow
def test_without_an_endpoint_the_sdk_is_never_imported(fleet_env: dict[str, str]) -> None:
    program = """
import sys
from fleet_kernel.config import load_settings
from fleet_kernel.events import TurnLimits, TurnStarted, make_event
from fleet_kernel.telemetry import Telemetry
import fleet_api.app, fleet_kernel.engine

settings = load_settings()
limits = TurnLimits(max_iters=1, max_llm_calls=1, timeout_s=1, exec_timeout_s=1)
started = TurnStarted(task="t", run_id="r", model=None, sandbox="local", limits=limits)
Telemetry(settings).committed([make_event(started, seq=1, session_id="s", turn_id="t")])
print(settings.tracing, sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    for extra in ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}):
        done = subprocess.run([sys.executable, "-c", program], env={**env, **fleet_env, **extra},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "False []"
