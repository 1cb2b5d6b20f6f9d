"""The probes bench/sandbox.py runs on each backend, in milliseconds; ``bench_pyodide()`` for Pyodide.

    python bench/sandbox_probes.py      # prints the Pyodide figures as JSON

``measure(factory)`` runs them on any interpreter factory (``dspy.LocalInterpreter`` too, which has no
observer, so its streaming figures are ``None``); tests/daytona/bench_fake.py reuses its helpers, so the
Daytona fake's figures have the same keys and the backends line up side by side.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_kernel.sandbox import base

STREAM_CODE = "import time\nfor _ in range(10):\n    print(time.time())\n    time.sleep(0.1)"


class Arrivals:
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


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def median(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interrupt_latency(interp: Any) -> float | None:
    """Seconds from ``interrupt()`` to ``execute`` giving up on code sleeping for 30 s; None without ``interrupt``."""
    interrupt = getattr(interp, "interrupt", None)
    if interrupt is None:
        return None
    fired: list[float] = []
    timer = threading.Timer(0.3, lambda: (fired.append(time.perf_counter()), interrupt()))
    timer.start()
    try:
        interp.execute("import time\ntime.sleep(30)")
    except Exception:  # noqa: BLE001 - the interrupted execute raises; only its timing matters here
        pass
    finally:
        timer.cancel()
    return time.perf_counter() - fired[0] if fired else None


def measure(factory: Callable[[], Any], runs: int = 30) -> dict[str, float | None]:
    """Cold start (``factory()`` to the first result), per-execute latency, 1 MB variables, streaming latency,
    and how soon an interrupt stops running code."""
    started = time.perf_counter()
    interp = factory()
    interp.execute("x = 0")
    cold = time.perf_counter() - started
    try:
        median(lambda: interp.execute("x += 1"), runs)  # let V8 tier the WebAssembly up before timing
        execute = median(lambda: interp.execute("x += 1"), runs)
        interp.tools["echo"] = lambda value: value
        tool = median(lambda: interp.execute("echo(1)"), runs)
        payloads = iter([str(i) * 1_000_000 for i in range(10)])
        inject = median(lambda: interp.execute("len(big)", variables={"big": next(payloads)}), 5)
        round_trip = median(lambda: interp.execute("big", variables={"big": next(payloads)}), 5)
        arrivals = Arrivals()
        token = base.observer.set(arrivals)
        try:
            interp.execute(STREAM_CODE)
        finally:
            base.observer.reset(token)
        interrupted = interrupt_latency(interp)
    finally:
        interp.shutdown()
    delays = arrivals.delays
    return {
        "cold_start_ms": ms(cold),
        "execute_ms": ms(execute),
        "execute_with_tool_call_ms": ms(tool),
        "inject_1mb_variable_ms": ms(inject),
        "round_trip_1mb_variable_ms": ms(round_trip),
        "stream_latency_median_ms": ms(statistics.median(delays)) if delays else None,
        "stream_latency_max_ms": ms(max(delays)) if delays else None,
        "interrupt_ms": ms(interrupted),
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
