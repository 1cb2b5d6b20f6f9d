"""``fleet_api.compat.wire``: every Fleet event type has its reference counterpart (or a stated none), and
what the live tests cannot easily provoke (tool calls, children, artifacts, a failure) maps as documented."""

from __future__ import annotations

import itertools
import json
from typing import Any

from fleet_api.compat.wire import DONE_FRAME, ChunkTranslator, StreamTranslator, chunk_frame, sse_frame
from fleet_kernel.events import (
    EVENT_TYPES,
    AgentFinished,
    AgentStarted,
    Artifact,
    Code,
    ErrorInfo,
    EventData,
    ExecutionFinished,
    IterationStarted,
    Output,
    ToolFinished,
    ToolStarted,
    TurnCompleted,
    TurnFailed,
    TurnUsage,
    make_event,
)

MAPPED = {
    "turn.started": "turn_status",
    "reasoning": "lm_end",
    "code": "repl_code",
    "execution.finished": "repl_output",
    "lm.finished": "budget_update",
    "tool.started": "tool_start",
    "tool.finished": "tool_end",
    "agent.started": "agent_spawn",
    "agent.finished": "agent_result",
    "turn.completed": "turn_complete",
    "turn.failed": "error",
    "turn.cancelled": "turn_cancelled",
}
# folded into a later event, or no counterpart (the reference streams no tokens: lm.delta is dropped, and
# the step's reasoning and code still arrive whole)
HELD = {"output", "artifact", "iteration.started", "lm.delta"}


def run(events: list[EventData], agent: str = "root") -> list[dict[str, Any]]:
    translator = StreamTranslator("ses_1", "turn_1")
    seq = itertools.count(1)
    out = [translator.prelude(0.0)]
    for data in events:
        event = make_event(data, seq=next(seq), session_id="ses_1", turn_id="turn_1", agent_id=agent)
        out.extend(translator.translate(event))
    return out


def test_every_fleet_event_type_is_accounted_for() -> None:
    assert set(EVENT_TYPES) == set(MAPPED) | HELD


def test_output_is_sent_whole_when_the_code_has_run_and_artifacts_with_the_outcome() -> None:
    out = run(
        [
            Code(iteration=1, code="print(1)"),
            Output(iteration=1, stream="stdout", text="a"),
            Output(iteration=1, stream="stderr", text="warn"),
            Output(iteration=1, stream="stdout", text="b\n"),
            ExecutionFinished(iteration=1, duration_ms=12.4, error=ErrorInfo(type="ValueError", message="bad")),
            ToolStarted(call_id="c1", name="llm_query", args_preview="('hi',)"),
            ToolFinished(call_id="c1", ok=True, result_preview="'hello'", duration_ms=3.0),
            AgentStarted(agent_id="a1", parent_agent_id="root", depth=1, task="sub"),
            AgentFinished(agent_id="a1", ok=True),
            Artifact(artifact_id="art_1", path="artifacts/r.csv", mime="text/csv", size=3, sha256="f" * 64),
            TurnCompleted(answer="42", usage=TurnUsage(), duration_ms=1500.0),
            TurnFailed(error=ErrorInfo(type="x", message="late")),  # after the outcome: dropped
        ]
    )
    names = [e["event"] for e in out]
    assert names == [
        "turn_status",
        "repl_code",
        "repl_output",
        "tool_start",
        "tool_end",
        "agent_spawn",
        "agent_result",
        "turn_complete",
        "done",
    ]
    assert [e["seq"] for e in out] == list(range(1, len(out) + 1))
    output = out[2]
    assert (output["stdout"], output["stderr"], output["duration_ms"]) == ("ab\n", "warn", 12)
    assert (output["error"], output["error_type"], output["outcome"]) == ("bad", "ValueError", "remote_code_error")
    assert out[3]["tool"] == "llm_query" and out[4]["output"] == "'hello'" and out[4]["call_id"] == "c1"
    complete = out[7]
    assert complete["answer"] == "42" and complete["duration_seconds"] == 1.5
    assert complete["artifacts"] == [{"path": "artifacts/r.csv", "sha256": "f" * 64, "agent_id": "root"}]
    assert out[-1]["payload"] == {}


def test_a_failure_is_an_error_outcome_then_done() -> None:
    out = run([TurnFailed(error=ErrorInfo(type="deadline_exceeded", message="ran past 10 s"))], agent="root")
    assert [e["event"] for e in out] == ["turn_status", "error", "done"]
    assert out[1]["outcome"] == "timeout" and out[1]["error"] == "ran past 10 s"
    assert out[1]["request_id"] == "turn_1"


def test_frames_have_an_id_and_data_but_no_event_line() -> None:
    frame = sse_frame(StreamTranslator("s", "t").prelude(1.0)).decode()
    lines = frame.rstrip("\n").split("\n")
    assert lines[0] == "id: 1" and lines[1].startswith("data: {") and len(lines) == 2 and frame.endswith("\n\n")


# ---------------------------------------------------------------------- 0.7.11's chunks

CHUNKED = {
    "turn.started": "turn_start",
    "iteration.started": "step_start",
    "reasoning": "reasoning",
    "code": "code",
    "output": "output",
    "execution.finished": "step_finish",
    "tool.started": "tool_call",
    "tool.finished": "tool_result",
    "agent.started": "child_progress",
    "agent.finished": "child_progress",
    "artifact": "artifact",
    "turn.completed": "turn_finish",
    "turn.failed": "turn_finish",
    "turn.cancelled": "turn_cancelled",
}
UNCHUNKED = {"lm.finished", "lm.delta"}  # summed into the outcome's usage chunk; steps arrive whole


def run_chunks(events: list[tuple[EventData, str]]) -> list[dict[str, Any]]:
    translator = ChunkTranslator("ses_1", "run_1", "turn_1")
    seq = itertools.count(1)
    out = [translator.prelude(0.0)]
    for data, agent in events:
        event = make_event(data, seq=next(seq), session_id="ses_1", turn_id="turn_1", agent_id=agent)
        out.extend(translator.translate(event))
    return out


def test_every_fleet_event_type_has_a_chunk_or_a_stated_none() -> None:
    assert set(EVENT_TYPES) == set(CHUNKED) | UNCHUNKED


def test_chunks_of_a_turn_with_a_child_a_tool_and_an_artifact() -> None:
    out = run_chunks(
        [
            (IterationStarted(iteration=1, max_iters=5), "root"),
            (Code(iteration=1, code="print(1)"), "root"),
            (Output(iteration=1, stream="stdout", text="a"), "root"),
            (
                ExecutionFinished(iteration=1, duration_ms=12.4, error=ErrorInfo(type="ValueError", message="bad")),
                "root",
            ),
            (ToolStarted(call_id="c1", name="llm_query", args_preview="('hi',)"), "root"),
            (ToolFinished(call_id="c1", ok=False, result_preview="boom", duration_ms=3.0), "root"),
            (AgentStarted(agent_id="a1", parent_agent_id="root", depth=1, task="sub task"), "root"),
            (Code(iteration=1, code="print(2)"), "a1"),  # a child's own step: summarised, not shown
            (AgentFinished(agent_id="a1", ok=True), "root"),
            (
                Artifact(
                    artifact_id="art_1", path="artifacts/r.json", mime="application/json", size=3, sha256="f" * 64
                ),
                "root",
            ),
            (TurnCompleted(answer="42", usage=TurnUsage(lm_calls=2), duration_ms=1500.0), "root"),
            (TurnFailed(error=ErrorInfo(type="x", message="late")), "root"),  # after the outcome: dropped
        ]
    )
    names = [c["type"] for c in out]
    assert names == [
        "turn_status",
        "step_start",
        "code",
        "output",
        "warning",
        "step_finish",
        "tool_call",
        "tool_result",
        "child_progress",
        "child_progress",
        "artifact",
        "text",
        "text",
        "usage",
        "turn_finish",
    ]
    assert out[3] == {"type": "output", "streamId": "1", "step": 1, "output": "a", "isDelta": True, "final": False}
    assert out[4]["message"] == "ValueError: bad" and out[5]["durationMs"] == 12
    assert out[7] == {"type": "tool_result", "toolCallId": "c1", "toolName": "llm_query", "error": "boom"}
    assert (out[8]["state"], out[9]["state"], out[9]["taskLabel"]) == ("running", "completed", "sub task")
    assert out[10]["artifactKind"] == "json" and out[10]["artifactId"] == "art_1"
    assert out[12] == {
        "type": "text",
        "streamId": "text",
        "delta": "",
        "text": "42",
        "final": True,
        "role": "assistant",
    }
    assert out[13]["usage"]["lm_calls"] == 2 and out[13]["iterations"] == 1
    assert out[-1] == {
        "type": "turn_finish", "finishReason": "stop", "status": "completed", "durationMs": 1500, "traceId": "turn_1"
    }  # fmt: skip


def test_a_failure_and_a_timeout_are_turn_error_then_turn_finish() -> None:
    failed = run_chunks([(TurnFailed(error=ErrorInfo(type="lm_error", message="no key")), "root")])
    assert failed[1:] == [
        {"type": "turn_error", "message": "no key", "code": "execution_failed"},
        {"type": "turn_finish", "finishReason": "error", "status": "error"},
    ]
    timed_out = run_chunks([(TurnFailed(error=ErrorInfo(type="deadline_exceeded", message="late")), "root")])
    assert timed_out[1]["code"] == "timeout" and timed_out[2]["finishReason"] == "timeout"


def test_chunk_frames_name_the_chunk_and_the_stream_ends_with_done() -> None:
    frame = chunk_frame(ChunkTranslator("s", "r", "t").prelude(1.0)).decode()
    assert frame.startswith("event: turn_status\ndata: {") and frame.endswith("\n\n")
    assert json.loads(frame.split("data: ", 1)[1])["phase"] == "preparation"
    assert DONE_FRAME == b"data: [DONE]\n\n"
