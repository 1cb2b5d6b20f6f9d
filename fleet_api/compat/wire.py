"""The one place that speaks fleet-rlm's wire vocabulary: Fleet's typed events and rows in, the
reference's stream envelopes, bodies and error shapes out, for both of its contracts: 0.8.1 (paths
without ``/api``: envelopes v1, ``{"detail": ...}`` errors) and 0.7.11 (paths under ``/api``: named
stream chunks ending in ``data: [DONE]``, ``{code, message}`` errors).

Nothing else in Fleet knows these names; the profile's routes call only this module to translate.
The mapping, and what has no counterpart, is documented in ``docs/api.md`` ("fleet-rlm profile").
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from fleet_kernel.events import Event
from fleet_kernel.store import ArtifactRow, AttachmentRow, SessionRow, TurnRow

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


def workspace_stat(path: str, size: int, sha256: str) -> dict[str, Any]:
    """0.8.1's ``FileStat``."""
    return {"path": path, "size_bytes": size, "sha256": sha256}


# ====================================================================== 0.7.11 (paths under /api)

DONE_FRAME = b"data: [DONE]\n\n"
"""0.7.11's last line: sent after the outcome, never after a dropped or failed stream."""
STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
# 0.7.11's closed error codes for statuses a route does not name itself (fleet_rlm.api.errors)
DEFAULT_CODES = {
    400: ("invalid_request", "Invalid request"),
    404: ("not_found", "Resource not found"),
    409: ("turn_in_progress", "Turn conflict"),
    422: ("invalid_request", "Invalid request"),
    503: ("turn_unavailable", "Service unavailable"),
}
SKILL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "fleet/skills")


def coded_error(code: str, message: str) -> dict[str, str]:
    """0.7.11's error body ``{code, message}``."""
    return {"code": code, "message": message}


def chunk_frame(chunk: dict[str, Any]) -> bytes:
    """``event: <type>`` and ``data: <json>``: 0.7.11 names each chunk (and sends no ``id:``)."""
    return f"event: {chunk['type']}\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


def open_failure(message: str) -> list[dict[str, Any]]:
    """A turn that could not open (unknown session, busy, a key of another task): inside the 200 stream."""
    return [
        {"type": "turn_error", "message": message, "code": "open_failed"},
        {"type": "turn_finish", "finishReason": "error", "status": "error"},
    ]


@dataclass
class ChunkTranslator:
    """One turn's stream as 0.7.11's typed chunks: a ``turn_status`` prelude, the turn's chunks, one
    outcome (``turn_finish``, ``turn_error`` + ``turn_finish``, or ``turn_cancelled``); ``[DONE]``
    follows (``DONE_FRAME``). Output streams as Fleet prints it (``isDelta``); a child agent's steps
    are summarised as ``child_progress``."""

    session_id: str
    run_id: str
    turn_id: str
    replay: bool = False
    outcome_sent: bool = False
    _tools: dict[str, str] = field(default_factory=dict)
    _children: dict[str, tuple[str, float]] = field(default_factory=dict)
    _steps: int = 0

    def prelude(self, ts: float) -> dict[str, Any]:
        return {"type": "turn_status", "phase": "preparation", "status": "running", "message": None}

    def error(self, message: str, ts: float) -> list[dict[str, Any]]:
        self.outcome_sent = True
        return open_failure(message)

    def translate(self, event: Event) -> list[dict[str, Any]]:
        if self.outcome_sent:
            return []
        out = self._map(event)
        if any(c["type"] in ("turn_finish", "turn_cancelled") for c in out):
            self.outcome_sent = True
        return out

    def _map(self, event: Event) -> list[dict[str, Any]]:  # noqa: C901 - a dispatch table, one case per event type
        d = event.data
        root = event.agent_id == "root"
        if not root and event.type not in ("agent.started", "agent.finished", "artifact"):
            return []  # a child's own steps: its progress is reported by agent_spawn/agent_result
        step = int(d.get("iteration", 0))
        stream = str(step or 1)
        match event.type:
            case "turn.started":
                start = {"type": "turn_start", "runId": self.run_id, "sessionId": self.session_id}
                start |= {"delivery": "replay" if self.replay else "live", "traceId": self.turn_id}
                return [start, {"type": "turn_status", "phase": "running", "status": "running", "message": None}]
            case "iteration.started":
                self._steps = max(self._steps, step)
                return [{"type": "step_start", "step": step}]
            case "reasoning":
                if not d["text"].strip():
                    return []
                return [
                    {
                        "type": "reasoning",
                        "streamId": stream,
                        "step": step,
                        "text": d["text"],
                        "delta": "",
                        "final": True,
                    }
                ]
            case "code":
                code = {"type": "code", "streamId": stream, "step": step, "code": d["code"]}
                return [code | {"isDelta": False, "final": True}]
            case "output":
                output = {"type": "output", "streamId": stream, "step": step, "output": d["text"]}
                return [output | {"isDelta": True, "final": False}]
            case "execution.finished":
                out: list[dict[str, Any]] = []
                if d.get("error"):
                    message = f"{d['error']['type']}: {d['error']['message']}"
                    out.append({"type": "warning", "message": message, "code": "remote_code_error"})
                return [*out, {"type": "step_finish", "step": step, "durationMs": _ms(d["duration_ms"])}]
            case "tool.started":
                self._tools[d["call_id"]] = d["name"]
                return [
                    {"type": "tool_call", "toolCallId": d["call_id"], "toolName": d["name"], "input": d["args_preview"]}
                ]
            case "tool.finished":
                result = {"type": "tool_result", "toolCallId": d["call_id"], "toolName": self._tools.get(d["call_id"])}
                return [result | ({"output": d["result_preview"]} if d["ok"] else {"error": d["result_preview"]})]
            case "agent.started":
                self._children[d["agent_id"]] = ((d["task"].strip() or d["agent_id"])[:240], _epoch(event.ts))
                return [self._child(d["agent_id"], "running", event.ts)]
            case "agent.finished":
                return [self._child(d["agent_id"], "completed" if d["ok"] else "failed", event.ts)]
            case "artifact":
                return [
                    {
                        "type": "artifact",
                        "artifactId": d["artifact_id"],
                        "artifactKind": artifact_kind(d["mime"]),
                        "title": d["path"],
                        "mediaType": d["mime"],
                        "byteSize": d["size"],
                        "checksumSha256": d["sha256"],
                    }
                ]
            case "turn.completed":
                usage = d.get("usage") or {}
                duration = _ms(d["duration_ms"])
                return [
                    {"type": "text", "streamId": "text", "delta": d["answer"], "final": False, "role": "assistant"},
                    {
                        "type": "text",
                        "streamId": "text",
                        "delta": "",
                        "text": d["answer"],
                        "final": True,
                        "role": "assistant",
                    },
                    {"type": "usage", "iterations": self._steps, "durationMs": duration, "usage": usage},
                    {
                        "type": "turn_finish",
                        "finishReason": "stop",
                        "status": "completed",
                        "durationMs": duration,
                        "traceId": self.turn_id,
                    },
                ]
            case "turn.failed":
                timeout = d["error"]["type"] == "deadline_exceeded"
                return [
                    {
                        "type": "turn_error",
                        "message": d["error"]["message"],
                        "code": "timeout" if timeout else "execution_failed",
                    },
                    {"type": "turn_finish", "finishReason": "timeout" if timeout else "error", "status": "error"},
                ]
            case "turn.cancelled":
                return [{"type": "turn_cancelled", "reason": d["reason"] or "Turn cancelled"}]
        return []  # lm.finished: its usage is summed into the outcome's usage chunk; lm.delta: steps arrive whole

    def _child(self, agent_id: str, state: str, ts: str) -> dict[str, Any]:
        label, started = self._children.get(agent_id, (agent_id, _epoch(ts)))
        return {
            "type": "child_progress",
            "childId": agent_id,
            "taskLabel": label,
            "state": state,
            "elapsedMs": max(0, round((_epoch(ts) - started) * 1000)),
            "cleanupState": "not_required",
            "parentRunId": self.run_id,
            "evidence": [],
            "gaps": [],
            "resultFileCount": 0,
        }


def artifact_kind(mime: str) -> str:
    """0.7.11 knows three kinds of artifact; anything not Markdown or JSON is ``text``."""
    if mime.startswith("text/markdown"):
        return "markdown"
    return "json" if mime.startswith("application/json") else "text"


def session_detail(row: SessionRow) -> dict[str, Any]:
    """0.7.11's ``SessionSummaryResponse`` (= its detail): a checkpoint per committed turn."""
    return {
        "id": row.session_id,
        "title": row.title or "New Session",
        "status": "archived" if row.archived else "active",
        "checkpoint_version": row.turn_count,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


def user_message(turn: TurnRow, attachment_ids: list[str]) -> dict[str, Any]:
    """A turn's task as 0.7.11's user ``UIMessage`` (sequence ``2 * position - 1``)."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": turn.task, "state": "done"}]
    parts += [{"type": "data-attachment", "data": {"attachmentId": a, "phase": "selected"}} for a in attachment_ids]
    metadata = {"schemaVersion": 1, "sessionId": turn.session_id, "sequence": 2 * turn.position - 1}
    return {
        "id": turn.turn_id,
        "role": "user",
        "parts": parts,
        "metadata": metadata | {"attachmentIds": attachment_ids},
    }


def assistant_message(turn: TurnRow, events: list[Event]) -> dict[str, Any]:
    """A committed turn as 0.7.11's assistant ``UIMessage``: its root steps, artifacts and answer."""
    parts: list[dict[str, Any]] = []
    outputs: dict[int, list[str]] = {}
    for event in events:
        d = event.data
        if event.agent_id != "root" and event.type != "artifact":
            continue
        step = int(d.get("iteration", 0))
        if event.type == "iteration.started":
            parts.append({"type": "step-start"})
        elif event.type == "reasoning" and d["text"].strip():
            parts.append({"type": "reasoning", "text": d["text"], "state": "done"})
        elif event.type == "code":
            parts.append({"type": "data-rlm-code", "data": {"code": d["code"], "step": step}})
        elif event.type == "output":
            outputs.setdefault(step, []).append(d["text"])
        elif event.type == "execution.finished" and step in outputs:
            parts.append({"type": "data-rlm-output", "data": {"output": "".join(outputs.pop(step)), "step": step}})
        elif event.type == "artifact":
            data = {"artifactId": d["artifact_id"], "kind": artifact_kind(d["mime"]), "title": d["path"]}
            data |= {"mediaType": d["mime"], "byteSize": d["size"], "checksumSha256": d["sha256"]}
            parts.append({"type": "data-artifact", "data": data})
    parts.append({"type": "text", "text": turn.answer or "", "state": "done"})
    if turn.usage:
        parts.append({"type": "data-usage", "data": turn.usage})
    metadata = {"schemaVersion": 1, "runId": turn.run_id, "sessionId": turn.session_id, "sequence": 2 * turn.position}
    return {"id": turn.run_id, "role": "assistant", "parts": parts, "metadata": metadata | {"traceId": turn.turn_id}}


def attachment_body(row: AttachmentRow) -> dict[str, Any]:
    return {
        "id": row.attachment_id,
        "filename": row.filename,
        "content_type": row.mime,
        "byte_size": row.size,
        "checksum_sha256": row.sha256,
    }


def artifact_body(row: ArtifactRow, run_id: str) -> dict[str, Any]:
    return {
        "id": row.artifact_id,
        "session_id": row.session_id,
        "run_id": run_id,
        "kind": artifact_kind(row.mime),
        "title": row.path,
        "media_type": row.mime,
        "byte_size": row.size,
        "checksum_sha256": row.sha256,
    }


def skill_card(name: str, description: str, body: str, source: str, has_resources: bool) -> dict[str, Any]:
    """0.7.11's ``SkillCardResponse``: the id is stable per name, the version is the card's digest."""
    return {
        "id": str(skill_id(name)),
        "name": name,
        "description": description,
        "scope": "system" if source == "bundled" else "workspace",
        "version": hashlib.sha256(body.encode()).hexdigest()[:12],
        "trust": "system" if source == "bundled" else "workspace",
        "affordances": [],
        "resources_available": has_resources,
    }


def skill_id(name: str) -> uuid.UUID:
    return uuid.uuid5(SKILL_NAMESPACE, name)
