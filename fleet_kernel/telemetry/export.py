"""``fleet trace export``: send the stored events of past turns as traces, as if they ran with tracing on.

The same ``TraceBuilder`` that follows live turns replays their events from the store, so a turn run
before tracing was switched on, or offline, looks the same in the collector as one traced live.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import ConfigError, FleetError
from fleet_kernel.events import Event
from fleet_kernel.telemetry import metrics

if TYPE_CHECKING:
    from fleet_kernel.store import Store

PAGE = 1000


async def _events(store: Store, turn_id: str) -> list[Event]:
    events: list[Event] = []
    while batch := await store.events_after(turn_id, events[-1].seq if events else 0, limit=PAGE):
        events.extend(batch)
    return events


async def export_turns(settings: Settings, turn_ids: list[str], session_id: str | None = None) -> tuple[int, list[str]]:
    """Export finished turns (by id, or every turn of ``session_id``); returns (exported, skipped ids).

    Raises:
        ConfigError: no OTLP endpoint is configured.
        NotFoundError: an unknown turn or session.
        FleetError: the collector did not take every span.
    """
    if not settings.tracing:
        raise ConfigError(
            "no trace endpoint: set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or OTEL_EXPORTER_OTLP_ENDPOINT), "
            "and unset OTEL_SDK_DISABLED; see docs/observability.md"
        )
    from fleet_kernel.store import Store  # the CLI starts without the store loaded
    from fleet_kernel.telemetry.tracing import Tracing  # the OpenTelemetry SDK only when tracing

    store = await Store.open(settings.database_url)
    tracing = Tracing(settings)
    try:
        ids = list(turn_ids)
        if session_id is not None:
            ids += [turn.turn_id for turn in await store.list_turns(session_id)]
        exported, skipped = 0, []
        lost_before = metrics.SPANS_LOST._value.get()
        for turn_id in ids:
            await store.get_turn(turn_id)
            events = await _events(store, turn_id)
            if not events or not events[-1].terminal:
                skipped.append(turn_id)  # still running (or empty): its trace has no end yet
                continue
            tracing.feed(events)
            exported += 1
        await asyncio.to_thread(tracing.flush)
        lost = metrics.SPANS_LOST._value.get() - lost_before
        if lost:
            raise FleetError(f"the trace collector did not take {lost:g} span(s); check the endpoint and headers")
        return exported, skipped
    finally:
        await asyncio.to_thread(tracing.provider.shutdown)
        await store.close()


@click.group()
def trace() -> None:
    """OpenTelemetry traces of turns (docs/observability.md)."""


@trace.command("export")
@click.argument("turn_ids", nargs=-1)
@click.option("--session", "session_id", help="Export every finished turn of this session.")
def trace_export(turn_ids: tuple[str, ...], session_id: str | None) -> None:
    """Send the stored events of past turns as traces to the configured OTLP endpoint."""
    if not turn_ids and session_id is None:
        raise click.UsageError("give one or more TURN_IDs, or --session SESSION_ID")
    try:
        exported, skipped = asyncio.run(export_turns(load_settings(), list(turn_ids), session_id))
    except FleetError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(f"Exported {exported} turn(s) as traces.")
    for turn_id in skipped:
        click.echo(f"Skipped {turn_id}: it has not finished.")
