"""Prometheus metrics of this process, counted from the events it commits.

One set per process (prometheus-client's default registry): the API serves it at ``GET /metrics``,
a kernel shows it in ``%fleet usage``. Counting is a few dictionary updates per committed event, on the
writer's side, so it never waits on anything.
"""

from __future__ import annotations

import collections
import functools
import threading
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

from fleet_kernel.events import (
    NOT_SENT,
    Event,
    LMFinished,
    TurnCancelledData,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)

__all__ = ["CONTENT_TYPE_LATEST", "exposition", "observe_commit", "observe_sandbox_start", "sse_clients", "usage"]

_DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
_FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

TURNS_STARTED = Counter("fleet_turns_started", "Turns started in this process")
TURNS_FINISHED = Counter("fleet_turns_finished", "Turns ended, by status", ["status"])
TURNS_RUNNING = Gauge("fleet_turns_running", "Turns running in this process")
TURN_DURATION = Histogram("fleet_turn_duration_seconds", "Wall time of a turn", buckets=_DURATION_BUCKETS)
FIRST_EVENT = Histogram(
    "fleet_turn_first_event_seconds", "From turn.started to the turn's next event", buckets=_FAST_BUCKETS
)
LM_CALLS = Counter("fleet_lm_calls", "LM calls, by role (root steps; sub: llm_query and child RLMs)", ["role"])
LM_TOKENS = Counter("fleet_lm_tokens", "LM tokens, by role and kind (prompt, completion)", ["role", "kind"])
LM_COST = Counter("fleet_lm_cost_usd", "LM cost in USD, by role", ["role"])
SANDBOX_STARTS = Counter("fleet_sandbox_starts", "Sandbox sessions started, by backend", ["backend"])
SANDBOX_START_TIME = Histogram(
    "fleet_sandbox_start_seconds", "Time to start a sandbox session, by backend", ["backend"], buckets=_FAST_BUCKETS
)
SSE_CLIENTS = Gauge("fleet_sse_clients", "SSE streams connected to this API")
EVENTS_COMMITTED = Counter("fleet_events_committed", "Events committed to the store, by type", ["type"])
COMMIT_LATENCY = Histogram("fleet_store_commit_seconds", "Time to commit one batch of events", buckets=_FAST_BUCKETS)
SPANS_LOST = Counter("fleet_trace_spans_lost", "Spans dropped: the collector was unreachable, slow or refused them")

_STATUS = {TurnCompleted.type: "completed", TurnFailed.type: "failed", TurnCancelledData.type: "cancelled"}
_lock = threading.Lock()
_open: dict[str, tuple[datetime, bool]] = {}  # turn_id -> (turn.started time, a later event seen)


@functools.cache
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: prometheus-client checks and locks on every lookup."""
    return metric.labels(*labels)


def _when(event: Event) -> datetime:
    return datetime.fromisoformat(event.ts)


def observe_commit(events: list[Event], seconds: float | None = None) -> None:
    """Count one committed batch (``seconds``: how long the commit took).

    Reads each event's ``data`` as stored (validated when the event was made), not its typed payload.
    """
    if seconds is not None:
        COMMIT_LATENCY.observe(seconds)
    for type_, count in collections.Counter(event.type for event in events).items():
        _child(EVENTS_COMMITTED, type_).inc(count)
    for event in events:
        with _lock:
            started = _open.get(event.turn_id)
            if event.type == TurnStarted.type:
                _open[event.turn_id] = (_when(event), False)
                TURNS_STARTED.inc()
                TURNS_RUNNING.inc()
                continue
            if started is not None and not started[1]:
                FIRST_EVENT.observe(max(0.0, (_when(event) - started[0]).total_seconds()))
                _open[event.turn_id] = (started[0], True)
            if event.type in _STATUS:
                _child(TURNS_FINISHED, _STATUS[event.type]).inc()
                opened = _open.pop(event.turn_id, None)
                if opened is not None:
                    TURNS_RUNNING.dec()
                    TURN_DURATION.observe(max(0.0, (_when(event) - opened[0]).total_seconds()))
        if event.type == LMFinished.type and event.data.get("finish_reason") != NOT_SENT:
            role, usage = event.data["role"], event.data["usage"]
            _child(LM_CALLS, role).inc()
            _child(LM_TOKENS, role, "prompt").inc(usage["prompt_tokens"])
            _child(LM_TOKENS, role, "completion").inc(usage["completion_tokens"])
            _child(LM_COST, role).inc(event.data.get("cost_usd") or 0.0)


def observe_sandbox_start(backend: str, seconds: float) -> None:
    _child(SANDBOX_STARTS, backend).inc()
    _child(SANDBOX_START_TIME, backend).observe(seconds)


def sse_clients() -> Gauge:
    """The gauge an SSE stream holds up while it is connected (``with sse_clients().track_inprogress():``)."""
    return SSE_CLIENTS


def exposition() -> bytes:
    """The Prometheus text format of every metric of this process."""
    return generate_latest(REGISTRY)


def summary_lines() -> list[str]:
    """The process's counters in a few readable lines (``%fleet usage``; the API serves them at ``/metrics``)."""
    v = usage()

    def by(prefix: str, label: str) -> str:
        items = sorted((k.split(f"{label}=")[1].split(",")[0].rstrip("}"), n) for k, n in v.items()
                       if k.startswith(prefix + "{"))  # fmt: skip
        return ", ".join(f"{name} {n:g}" for name, n in items) or "none"

    tokens = {kind: sum(n for k, n in v.items() if k.startswith("fleet_lm_tokens_total{") and f"kind={kind}" in k)
              for kind in ("prompt", "completion")}  # fmt: skip
    cost = sum(n for k, n in v.items() if k.startswith("fleet_lm_cost_usd_total"))
    return [
        f"this process: turns started {v.get('fleet_turns_started_total', 0):g}, running "
        f"{v.get('fleet_turns_running', 0):g}, finished ({by('fleet_turns_finished_total', 'status')})",
        f"this process: LM calls ({by('fleet_lm_calls_total', 'role')}), tokens {tokens['prompt']:,.0f} in, "
        f"{tokens['completion']:,.0f} out, ${cost:.4f}",
        f"this process: sandbox starts ({by('fleet_sandbox_starts_total', 'backend')}), events committed "
        f"{sum(n for k, n in v.items() if k.startswith('fleet_events_committed_total')):g}, trace spans lost "
        f"{v.get('fleet_trace_spans_lost_total', 0):g}",
    ]


def usage() -> dict[str, float]:
    """The counters as plain numbers (``%fleet usage``): name (with labels) -> value."""
    values: dict[str, float] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("fleet_"):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sample.labels.items())
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
