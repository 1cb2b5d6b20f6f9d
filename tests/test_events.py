"""Tests for fleet_kernel.events: the one vocabulary, typed."""

from __future__ import annotations

import json

import pydantic
import pytest

from fleet_kernel.events import EVENT_TYPES, TERMINAL_TYPES, make_event


def test_envelope_shape_matches_the_contract() -> None:
    event = make_event(
        "output", {"iteration": 2, "stream": "stdout", "text": "hi\n"}, seq=7, session_id="s", turn_id="t"
    )
    envelope = json.loads(event.to_json())
    assert set(envelope) == {"v", "seq", "type", "session_id", "turn_id", "agent_id", "parent_agent_id", "ts", "data"}
    assert envelope["v"] == 1 and envelope["seq"] == 7 and envelope["agent_id"] == "root"
    assert envelope["ts"].endswith("Z") and len(envelope["ts"]) == len("2026-11-30T12:00:00.123Z")


def test_unknown_type_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        make_event("turn.exploded", {}, seq=1, session_id="s", turn_id="t")


def test_missing_or_extra_field_is_caught() -> None:
    with pytest.raises(pydantic.ValidationError):
        make_event("reasoning", {"iteration": 1}, seq=1, session_id="s", turn_id="t")
    with pytest.raises(pydantic.ValidationError):
        make_event("reasoning", {"iteration": 1, "text": "x", "mood": "happy"}, seq=1, session_id="s", turn_id="t")


def test_vocabulary_is_the_documented_one() -> None:
    assert set(EVENT_TYPES) == {
        "turn.started", "iteration.started", "reasoning", "code", "output", "execution.finished",
        "lm.finished", "tool.started", "tool.finished", "agent.started", "agent.finished", "artifact",
        "turn.completed", "turn.failed", "turn.cancelled",
    }  # fmt: skip
    assert TERMINAL_TYPES == {"turn.completed", "turn.failed", "turn.cancelled"}


def test_every_type_is_documented_in_docs() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "events.md").read_text()
    for name in EVENT_TYPES:
        assert f"`{name}`" in doc, f"docs/events.md does not document {name}"
