"""Views of the event log an observability stack can read: Prometheus metrics and OpenTelemetry traces.

``Telemetry`` is fed every batch the process's ``EventWriter`` commits. Metrics are always counted;
traces exist only when an OTLP endpoint is configured (``Settings.tracing``), and only then is the
OpenTelemetry SDK imported. Neither can fail or slow a turn: an error here is logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from fleet_kernel.config import Settings
from fleet_kernel.events import Event
from fleet_kernel.telemetry import metrics

if TYPE_CHECKING:
    from fleet_kernel.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 5.0


def _open_tracing(settings: Settings) -> Tracing | None:
    """Traces of this process's turns, or None when the SDK is missing or cannot be set up (logged)."""
    try:
        from fleet_kernel.telemetry.tracing import Tracing  # the OpenTelemetry SDK, only now
    except ImportError as exc:
        log.error("traces: %s; install fleet-kernel[telemetry] to export traces. Turns run without them.", exc)
        return None
    try:
        return Tracing(settings)
    except Exception:  # noqa: BLE001 - a tracing set-up that fails must not stop turns
        log.exception("traces: cannot set up the OpenTelemetry exporter; turns run without traces")
        return None


class Telemetry:
    """This process's metrics and (when configured) traces of the turns it commits."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.tracing: Tracing | None = None
        if settings is not None and settings.tracing:
            self.tracing = _open_tracing(settings)
        self._failed = False

    def committed(self, events: list[Event], seconds: float | None = None) -> None:
        """A batch is in the store (``seconds``: the commit's duration)."""
        try:
            metrics.observe_commit(events, seconds)
            if self.tracing is not None:
                self.tracing.feed(events)
        except Exception:  # noqa: BLE001 - a view of the log must never break the log
            if not self._failed:
                self._failed = True
                log.exception("telemetry: could not record committed events; turns are unaffected")

    async def close(self) -> None:
        """Send what is left, waiting at most ``CLOSE_WAIT_S`` for a collector."""
        if self.tracing is None:
            return
        thread = threading.Thread(target=self.tracing.provider.shutdown, name="fleet-trace-shutdown", daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join, CLOSE_WAIT_S)
        self.tracing = None
