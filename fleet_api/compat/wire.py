"""The one place that speaks fleet-rlm's wire vocabulary: Fleet's typed events and rows in, the
reference's (0.8.1) stream envelopes, bodies and error shape out.

Nothing else in Fleet knows these names; the profile's routes call only this module to translate.
The mapping, and what has no counterpart, is documented in ``docs/api.md`` ("fleet-rlm profile").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from fleet_kernel.events import Event
from fleet_kernel.store import TurnRow

WIRE_VERSION = 1
ROUTE = "rlm"  # Fleet runs every turn as dspy.RLM: the reference's "rlm" mode and route
# Fleet's turn statuses as the reference's (it has no "interrupted": a dead owner's turn failed)
TURN_STATUS = {"running": "running", "completed": "completed", "failed": "failed", "cancelled": "cancelled"}
OUTCOMES = frozenset({"turn_complete", "error", "turn_cancelled"})


def error_body(message: str) -> dict[str, str]:
    """The reference's error body: FastAPI's ``{"detail": message}``."""
    return {"detail": message}


def sse_frame(envelope: dict[str, Any]) -> bytes:
    """``id: <seq>`` and ``data: <json>``, with no ``event:`` line (the type is inside the JSON)."""
    return f"id: {envelope['seq']}\ndata: {json.dumps(envelope, separators=(',', ':'))}\n\n".encode()


def _ms(value: float) -> int:
    return round(value)


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass
class StreamTranslator:
    """One turn's stream in the reference's envelopes: numbered 1, 2, 3... per stream, a
    ``turn_status`` prelude, one outcome, then ``done``.

    Fleet streams a step's output as it is printed; the reference sends it whole once the code has run,
    so chunks are held until ``execution.finished``. Artifacts are reported with the outcome.
    """

    session_id: str
    turn_id: str
    seq: int = 0
    lm_calls: int = 0
    max_llm_calls: int | None = None
    outcome_sent: bool = False
    _stdout: dict[str, list[str]] = field(default_factory=dict)
    _stderr: dict[str, list[str]] = field(default_factory=dict)
    _artifacts: list[dict[str, Any]] = field(default_factory=list)

    def envelope(
        self, event: str, payload: dict[str, Any], *, agent_id: str = "root", parent: str | None = None, ts: float
    ) -> dict[str, Any]:
        """The reference's envelope v1, the payload spread flat beside it as the reference does."""
        self.seq += 1
        return {
            "version": WIRE_VERSION,
            "event": event,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "agent_id": agent_id,
            "parent_agent_id": parent,
            "sandbox_id": None,
            "seq": self.seq,
            "timestamp": ts,
            "payload": payload,
            **payload,
        }

    def prelude(self, ts: float) -> dict[str, Any]:
        return self.envelope("turn_status", {"phase": "preparation"}, ts=ts)

    def error(self, message: str, ts: float) -> list[dict[str, Any]]:
        """An in-stream failure before or without a Fleet outcome (the reference's 200-stream error)."""
        self.outcome_sent = True
        body = {"outcome": "failed", "error": message, "request_id": self.turn_id, "duration_seconds": 0.0}
        return [self.envelope("error", body, ts=ts), self.envelope("done", {}, ts=ts)]

    def translate(self, event: Event) -> list[dict[str, Any]]:
        """The reference envelopes for one Fleet event (none, one, or an outcome and ``done``)."""
        named = self._map(event)
        if named is None or self.outcome_sent:
            return []
        name, payload = named
        ts = _epoch(event.ts)
        out = [self.envelope(name, payload, agent_id=event.agent_id, parent=event.parent_agent_id, ts=ts)]
        if name in OUTCOMES:
            self.outcome_sent = True
            out.append(self.envelope("done", {}, ts=ts))
        return out

    def _map(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        d = event.data
        exec_id = f"{event.agent_id}-{d.get('iteration', 0)}"
        match event.type:
            case "turn.started":
                self.max_llm_calls = d["limits"]["max_llm_calls"]
                return "turn_status", {"phase": "running", "model": d.get("model"), "status": "progressing"}
            case "reasoning":
                return "lm_end", {
                    "call_id": f"{exec_id}-reasoning",
                    "model": None,
                    "ok": True,
                    "reasoning": d["text"],
                    "status": "progressing",
                }
            case "code":
                self._stdout[exec_id], self._stderr[exec_id] = [], []
                return "repl_code", {
                    "execution_id": exec_id,
                    "phase": "task",
                    "code": d["code"],
                    "status": "progressing",
                }
            case "output":
                (self._stdout if d["stream"] == "stdout" else self._stderr).setdefault(exec_id, []).append(d["text"])
                return None
            case "execution.finished":
                error = d.get("error")
                return "repl_output", {
                    "execution_id": exec_id,
                    "phase": "task",
                    "stdout": "".join(self._stdout.pop(exec_id, [])),
                    "stderr": "".join(self._stderr.pop(exec_id, [])),
                    "value": None,
                    "duration_ms": _ms(d["duration_ms"]),
                    "error": error["message"] if error else None,
                    "error_type": error["type"] if error else None,
                    "outcome": "remote_code_error" if error else "completed",
                    "status": "progressing",
                }
            case "lm.finished":
                self.lm_calls += 1
                usage = d.get("usage") or {}
                return "budget_update", {
                    "lm_calls": self.lm_calls,
                    "max_llm_calls": self.max_llm_calls,
                    "usage": {
                        "prompt_tokens": usage.get("prompt_tokens"),
                        "completion_tokens": usage.get("completion_tokens"),
                    },
                    "status": "progressing",
                }
            case "tool.started":
                return "tool_start", {
                    "call_id": d["call_id"],
                    "tool": d["name"],
                    "source": "sandbox_bridge",
                    "inputs": d["args_preview"],
                    "status": "waiting_on_host",
                }
            case "tool.finished":
                return "tool_end", {
                    "call_id": d["call_id"],
                    "ok": d["ok"],
                    "output": d["result_preview"],
                    "duration_ms": _ms(d["duration_ms"]),
                    "status": "progressing",
                }
            case "agent.started":
                return "agent_spawn", {"agent_id": d["agent_id"], "depth": d["depth"], "subtask": d["task"]}
            case "agent.finished":
                return "agent_result", {"agent_id": d["agent_id"], "ok": d["ok"], "artifacts": []}
            case "artifact":
                self._artifacts.append({"path": d["path"], "sha256": d["sha256"], "agent_id": event.agent_id})
                return None
            case "turn.completed":
                return "turn_complete", {
                    "answer": d["answer"],
                    "route": ROUTE,
                    "duration_seconds": d["duration_ms"] / 1000,
                    "learned_skill_note": None,
                    "artifacts": self._artifacts,
                    "lm_calls": self.lm_calls,
                    "sandbox_errors": 0,
                }
            case "turn.failed":
                return "error", {
                    "outcome": "timeout" if d["error"]["type"] == "deadline_exceeded" else "failed",
                    "error": d["error"]["message"],
                    "request_id": self.turn_id,
                    "duration_seconds": None,
                    "cleanup": "stopped",
                }
            case "turn.cancelled":
                return "turn_cancelled", {
                    "outcome": "cancelled",
                    "error": d["reason"],
                    "request_id": self.turn_id,
                    "duration_seconds": None,
                    "cleanup": "stopped",
                }
        return None  # iteration.started: the reference has no per-step marker


# ---------------------------------------------------------------------- bodies


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.replace(tzinfo=None).isoformat() + "Z"


def session_summary(session_id: str, updated_at: datetime, turn_count: int) -> dict[str, Any]:
    return {"session_id": session_id, "updated_at": _iso(updated_at), "turn_count": turn_count}


def history_record(turn: TurnRow) -> dict[str, Any]:
    """A committed turn as the reference's history keeps it."""
    return {
        "turn_id": turn.turn_id,
        "task": turn.task,
        "answer": turn.answer or "",
        "route": ROUTE,
        "created_at": _iso(turn.started_at),
    }


def turn_status(turn: TurnRow) -> dict[str, Any]:
    """``GET /sessions/{id}/turns/{turn_id}``: the recovery read after a dropped stream."""
    status = TURN_STATUS.get(turn.status, "failed")
    if status == "failed" and (turn.error or {}).get("type") == "deadline_exceeded":
        status = "cancelled"  # the reference records a Turn past its deadline as cancelled
    result: dict[str, Any] = {}
    if status == "completed":
        result = {"answer": turn.answer or "", "route": ROUTE}
    elif turn.error:
        result = {"error": turn.error.get("message", "the turn failed")}
    updated = turn.finished_at or turn.heartbeat_at or turn.started_at
    return {"turn_id": turn.turn_id, "status": status, "result": result, "updated_at": _iso(updated)}


def skills_xml(skills: list[tuple[str, str]]) -> str:
    """The reference's skill catalog: ``<available_skills><skill name=...>description</skill>...``."""
    cards = "".join(f"<skill name={quoteattr(name)}>{escape(description)}</skill>" for name, description in skills)
    return f"<available_skills>{cards}</available_skills>"
