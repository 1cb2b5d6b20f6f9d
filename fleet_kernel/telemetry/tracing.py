"""OpenTelemetry traces of turns, built from their events.

The event log is the truth of a turn; a trace is one view of it. ``TraceBuilder`` is fed a turn's events in
order (live as they are committed, or replayed from the store by ``fleet trace export``) and turns them into
spans with the events' own times:

    fleet.turn (invoke_agent)                 turn.started … terminal event; ids, model, sandbox, usage
      fleet.iteration                         iteration.started … the next one (per agent)
        chat {model}                          lm.finished (GenAI conventions: gen_ai.*)
        fleet.execute_code                    code … execution.finished
          execute_tool {name}                 tool.started … tool.finished
            chat {model}                      the sub-LM call of llm_query
            invoke_agent {agent_id}           agent.started … agent.finished: a child RLM, its iterations below

Prompts and outputs (task, reasoning, code, printed output, tool arguments and results, answer) are attached
only with ``FLEET_TRACE_CONTENT=1``, scrubbed of every configured secret; without it a failed step's error is
only the exception's line (its message begins with what the code printed). This module (and with it the
OpenTelemetry SDK) is imported only when an endpoint is configured; export is batched on the
SDK's own thread, and a collector that is slow or unreachable loses spans (counted, logged once) without
touching the turn.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, Tracer

from fleet_kernel.config import Settings
from fleet_kernel.events import (
    ROOT_AGENT,
    AgentFinished,
    AgentStarted,
    Artifact,
    Code,
    Event,
    ExecutionFinished,
    IterationStarted,
    LMFinished,
    Output,
    Reasoning,
    ToolFinished,
    ToolStarted,
    TurnCancelledData,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)
from fleet_kernel.telemetry import metrics

log = logging.getLogger(__name__)

MAX_CONTENT_CHARS = 8_000
MAX_ERROR_CHARS = 500
_TRACEBACK = "Traceback (most recent call last):"
# The exception's line at the end of a traceback ("ValueError: bad row"), after the frames' indented lines.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$", re.M)
# The SDK logs every failed export and every dropped span; Fleet counts those and logs the first (``lost``).
_SDK_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal")


def _ns(ts: str) -> int:
    """An event's ISO timestamp as OpenTelemetry's nanoseconds since the epoch."""
    return int(datetime.fromisoformat(ts).timestamp() * 1_000_000) * 1_000


@dataclass
class _Agent:
    span: Span
    iteration: Span | None = None
    execution: Span | None = None
    output: list[str] = field(default_factory=list)
    tools: dict[str, Span] = field(default_factory=dict)

    def innermost(self) -> Span:
        """Where something this agent does now belongs: its open tool call, code run, iteration, itself."""
        if self.tools:
            return next(reversed(self.tools.values()))
        return self.execution or self.iteration or self.span


class TraceBuilder:
    """The spans of one turn, from its events in ``seq`` order."""

    def __init__(self, tracer: Tracer, settings: Settings) -> None:
        self._tracer = tracer
        self._content = settings.trace_content
        self._redactor = settings.redactor
        self._agents: dict[str, _Agent] = {}
        self._root: Span | None = None
        self._started: TurnStarted | None = None
        self.done = False

    # ------------------------------------------------------------------ helpers

    def _text(self, text: str) -> str:
        return self._redactor.text(text)[:MAX_CONTENT_CHARS]

    def _code_error(self, kind: str, message: str) -> str:
        """A failed step's error as the trace shows it. Its message is what the code printed, then the
        traceback: with content capture off only the exception's own line goes (``ValueError: ...``)."""
        if self._content:
            return self._text(message)
        _, marker, traceback = message.rpartition(_TRACEBACK)
        raised = _EXCEPTION_LINE.findall(traceback) if marker else []
        return self._text(raised[-1][:MAX_ERROR_CHARS]) if raised else f"the code raised {kind}"

    def _start(self, name: str, parent: Span, ts: str | int, attributes: dict[str, Any]) -> Span:
        start = ts if isinstance(ts, int) else _ns(ts)
        context = trace.set_span_in_context(parent)
        return self._tracer.start_span(name, context=context, start_time=start, attributes=attributes)

    def _error(self, span: Span, message: str, kind: str | None = None) -> None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        if kind:
            span.set_attribute("error.type", kind)

    def _end_agent_work(self, agent: _Agent, end: int) -> None:
        for span in reversed(list(agent.tools.values())):
            span.end(end_time=end)
        agent.tools.clear()
        for open_span in (agent.execution, agent.iteration):
            if open_span is not None:
                open_span.end(end_time=end)
        agent.execution = agent.iteration = None

    # ------------------------------------------------------------------ events

    def feed(self, event: Event) -> None:  # noqa: C901 - a dispatch table, one branch per event type
        """Take the turn's next event; spans end (and go to the exporter) as their closing events arrive."""
        if self.done:
            return
        data = event.payload
        if isinstance(data, TurnStarted):
            self._turn_started(event, data)
            return
        root = self._root
        if root is None:  # a replay that starts mid-turn: nothing to hang spans on
            return
        agent = self._agents.get(event.agent_id) or self._agents[ROOT_AGENT]
        end = _ns(event.ts)
        if isinstance(data, IterationStarted):
            self._end_agent_work(agent, end)
            agent.iteration = self._start(
                "fleet.iteration", agent.span, event.ts,
                {"fleet.iteration": data.iteration, "fleet.max_iters": data.max_iters,
                 "fleet.agent_id": event.agent_id},
            )  # fmt: skip
        elif isinstance(data, Reasoning) and self._content and agent.iteration is not None:
            agent.iteration.set_attribute("fleet.reasoning", self._text(data.text))
        elif isinstance(data, Code):
            attributes: dict[str, Any] = {"fleet.iteration": data.iteration}
            if self._content:
                attributes["fleet.code"] = self._text(data.code)
            agent.execution = self._start("fleet.execute_code", agent.iteration or agent.span, event.ts, attributes)
            agent.output = []
        elif isinstance(data, Output) and self._content:
            agent.output.append(data.text)
        elif isinstance(data, ExecutionFinished):
            self._execution_finished(agent, data, end)
        elif isinstance(data, LMFinished):
            self._lm_finished(agent, data, end)
        elif isinstance(data, ToolStarted):
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": data.name,
                          "gen_ai.tool.call.id": data.call_id}  # fmt: skip
            if self._content:
                attributes["gen_ai.tool.call.arguments"] = self._text(data.args_preview)
            agent.tools[data.call_id] = self._start(
                f"execute_tool {data.name}", agent.innermost(), event.ts, attributes
            )
        elif isinstance(data, ToolFinished):
            span = agent.tools.pop(data.call_id, None)
            if span is not None:
                span.set_attribute("fleet.duration_ms", data.duration_ms)
                if self._content:
                    span.set_attribute("gen_ai.tool.call.result", self._text(data.result_preview))
                if not data.ok:
                    self._error(span, "the tool call raised")
                span.end(end_time=end)
        elif isinstance(data, AgentStarted):
            self._agent_started(event, data, agent)
        elif isinstance(data, AgentFinished):
            child = self._agents.pop(data.agent_id, None)
            if child is not None:
                self._end_agent_work(child, end)
                if not data.ok:
                    self._error(child.span, "the child RLM raised")
                child.span.end(end_time=end)
        elif isinstance(data, Artifact):
            agent.innermost().add_event(
                "fleet.artifact", {"path": data.path, "mime": data.mime, "size": data.size}, timestamp=end
            )
        elif isinstance(data, TurnCompleted | TurnFailed | TurnCancelledData):
            self._turn_ended(root, data, end)

    def _turn_started(self, event: Event, data: TurnStarted) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "fleet",
            "gen_ai.conversation.id": event.session_id,
            "fleet.session_id": event.session_id,
            "fleet.turn_id": event.turn_id,
            "fleet.run_id": data.run_id,
            "fleet.sandbox": data.sandbox,
            "fleet.max_iters": data.limits.max_iters,
        }
        if data.model:
            attributes["gen_ai.request.model"] = data.model
        if self._content:
            attributes["fleet.task"] = self._text(data.task)
        self._started = data
        self._root = self._tracer.start_span("fleet.turn", start_time=_ns(event.ts), attributes=attributes)
        self._agents[ROOT_AGENT] = _Agent(self._root)

    def _execution_finished(self, agent: _Agent, data: ExecutionFinished, end: int) -> None:
        span = agent.execution
        if span is None:
            return
        span.set_attribute("fleet.duration_ms", data.duration_ms)
        if self._content and agent.output:
            span.set_attribute("fleet.output", self._text("".join(agent.output)))
        if data.error is not None:
            message = self._code_error(data.error.type, data.error.message)
            span.set_attribute("fleet.error.message", message)
            self._error(span, message, data.error.type)
        span.end(end_time=end)
        agent.execution = None

    def _lm_finished(self, agent: _Agent, data: LMFinished, end: int) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": data.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": data.usage.completion_tokens,
            "fleet.lm.role": data.role,
            "fleet.duration_ms": data.duration_ms,
        }
        if data.model:
            attributes["gen_ai.request.model"] = data.model
            attributes["gen_ai.provider.name"] = data.model.split("/", 1)[0] if "/" in data.model else "unknown"
        if data.cost_usd is not None:
            attributes["fleet.cost_usd"] = data.cost_usd
        if data.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [data.finish_reason]
        start = end - int(data.duration_ms * 1_000_000)
        span = self._start(f"chat {data.model or 'lm'}", agent.innermost(), start, attributes)
        span.end(end_time=end)

    def _agent_started(self, event: Event, data: AgentStarted, parent: _Agent) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": data.agent_id,
            "fleet.agent_id": data.agent_id,
            "fleet.depth": data.depth,
        }
        if self._content:
            attributes["fleet.task"] = self._text(data.task)
        span = self._start(f"invoke_agent {data.agent_id}", parent.innermost(), event.ts, attributes)
        self._agents[data.agent_id] = _Agent(span)

    def _turn_ended(self, root: Span, data: TurnCompleted | TurnFailed | TurnCancelledData, end: int) -> None:
        for agent_id, agent in reversed(list(self._agents.items())):
            self._end_agent_work(agent, end)
            if agent_id != ROOT_AGENT:
                agent.span.end(end_time=end)
        if isinstance(data, TurnCompleted):
            root.set_attributes({
                "fleet.status": "completed",
                "fleet.usage.lm_calls": data.usage.lm_calls,
                "fleet.usage.prompt_tokens": data.usage.prompt_tokens,
                "fleet.usage.completion_tokens": data.usage.completion_tokens,
                "fleet.cost_usd": data.usage.cost_usd,
                "fleet.duration_ms": data.duration_ms,
                "fleet.extracted": data.extracted,
            })  # fmt: skip
            if self._content:
                root.set_attribute("fleet.answer", self._text(data.answer))
        elif isinstance(data, TurnFailed):
            root.set_attribute("fleet.status", "failed")
            self._error(root, self._text(data.error.message), data.error.type)
        else:
            root.set_attribute("fleet.status", "cancelled")
            self._error(root, self._text(data.reason), "cancelled")
        root.end(end_time=end)
        self.done = True


class _CountingExporter(SpanExporter):
    """The OTLP/HTTP exporter, counting the spans of every batch it could not deliver (logged once)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter

    def export(self, spans: Any) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:  # noqa: BLE001 - a broken collector loses spans, never more
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            lost(len(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis))


_warned = threading.Event()


def lost(count: int) -> None:
    """Spans that never reached the collector: counted always, logged the first time only."""
    metrics.SPANS_LOST.inc(count)
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "traces: %d span(s) could not be exported (collector unreachable, slow or refusing); turns are "
            "unaffected, and further losses are only counted (fleet_trace_spans_lost_total)",
            count,
        )


class Tracing:
    """A tracer provider with a batching OTLP/HTTP exporter, and one ``TraceBuilder`` per open turn."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        for name in _SDK_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "fleet"}))
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.processor = _LossCountingProcessor(_CountingExporter(OTLPSpanExporter()))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("fleet")
        self._turns: dict[str, TraceBuilder] = {}

    def feed(self, events: list[Event]) -> None:
        """Committed events of any turns, in order per turn."""
        for event in events:
            builder = self._turns.get(event.turn_id)
            if builder is None:
                builder = self._turns[event.turn_id] = TraceBuilder(self.tracer, self.settings)
            builder.feed(event)
            if builder.done:
                del self._turns[event.turn_id]

    def flush(self, timeout_s: float = 30.0) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))


class _LossCountingProcessor(BatchSpanProcessor):
    """The batch processor, also counting the spans it drops because its queue is full (a slow collector)."""

    def on_end(self, span: ReadableSpan) -> None:
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
            lost(1)
        super().on_end(span)
