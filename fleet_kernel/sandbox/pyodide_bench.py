"""Figures for the Pyodide backend: ``bench_pyodide()`` (used by bench/sandbox.py), in milliseconds.

    python -m fleet_kernel.sandbox.pyodide_bench      # prints the figures as JSON

Same keys as the Daytona fake's ``bench_daytona_fake()``, so the backends line up side by side.
``measure(factory)`` runs the same probes on any interpreter factory (``dspy.LocalInterpreter`` too,
which has no observer, so its streaming figures are ``None``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_kernel.sandbox import base

_STREAM_CODE = "import time\nfor _ in range(10):\n    print(time.time())\n    time.sleep(0.1)"


class _Arrivals:
    """Observer noting how long each printed timestamp took to reach the host."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def on_output(self, stream: str, text: str) -> None:
        now = time.time()
        self.delays += [now - float(line) for line in text.split() if line.replace(".", "", 1).isdigit()]

    def on_tool_start(self, name: str, args: Any, kwargs: Any) -> str:
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _median(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(factory: Callable[[], Any], runs: int = 30) -> dict[str, float | None]:
    """Cold start (``factory()`` to the first result), per-execute latency, 1 MB variables, streaming latency."""
    started = time.perf_counter()
    interp = factory()
    interp.execute("x = 0")
    cold = time.perf_counter() - started
    try:
        _median(lambda: interp.execute("x += 1"), runs)  # let V8 tier the WebAssembly up before timing
        execute = _median(lambda: interp.execute("x += 1"), runs)
        interp.tools["echo"] = lambda value: value
        tool = _median(lambda: interp.execute("echo(1)"), runs)
        payloads = iter([str(i) * 1_000_000 for i in range(10)])
        inject = _median(lambda: interp.execute("len(big)", variables={"big": next(payloads)}), 5)
        round_trip = _median(lambda: interp.execute("big", variables={"big": next(payloads)}), 5)
        arrivals = _Arrivals()
        token = base.observer.set(arrivals)
        try:
            interp.execute(_STREAM_CODE)
        finally:
            base.observer.reset(token)
    finally:
        interp.shutdown()
    delays = arrivals.delays
    return {
        "cold_start_ms": _ms(cold),
        "execute_ms": _ms(execute),
        "execute_with_tool_call_ms": _ms(tool),
        "inject_1mb_variable_ms": _ms(inject),
        "round_trip_1mb_variable_ms": _ms(round_trip),
        "stream_latency_median_ms": _ms(statistics.median(delays)) if delays else None,
        "stream_latency_max_ms": _ms(max(delays)) if delays else None,
    }


def bench_pyodide(runs: int = 30) -> dict[str, float | None]:
    """``measure`` on the Pyodide backend in a throwaway home and workspace (Deno and the cache must be there)."""
    from fleet_kernel.config import Settings
    from fleet_kernel.sandbox.pyodide import open_pyodide

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        settings = Settings(home=Path(tmp) / "home", database_url="sqlite://", sandbox="pyodide")
        factory = open_pyodide(settings, Path(tmp) / "workspace")
        try:
            return measure(factory, runs)
        finally:
            factory.close()


if __name__ == "__main__":
    print(json.dumps(bench_pyodide(), indent=2))
