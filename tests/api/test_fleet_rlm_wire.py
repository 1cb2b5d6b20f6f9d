"""``fleet_api.compat.wire``: every Fleet event type has its reference counterpart (or a stated none), and
what the live tests cannot easily provoke (tool calls, children, artifacts, a failure) maps as documented."""

from __future__ import annotations

import itertools
from typing import Any

from fleet_api.compat.wire import StreamTranslator, sse_frame
from fleet_kernel.events import (
    EVENT_TYPES,
    AgentFinished,
    AgentStarted,
    Artifact,
    Code,
    ErrorInfo,
    EventData,
    ExecutionFinished,
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
