"""Sandbox figures for ``bench/sandbox.py``: cold start, execute latency, a 1 MB variable, streaming latency.

``measure(factory)`` works on any interpreter factory (Fleet's backends, or ``dspy.LocalInterpreter``
for comparison); ``bench_pyodide()`` measures the Pyodide backend in a throwaway workspace.

    from fleet_kernel.sandbox.pyodide_bench import bench_pyodide
    print(bench_pyodide().as_row())
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.sandbox.base import observer

_STREAM_CODE = (
    "import time\nprint(repr(time.time()))\n_t = time.monotonic()\nwhile time.monotonic() - _t < 0.2:\n    pass"
)


@dataclass(frozen=True)
class Figures:
    """Medians in milliseconds; ``None`` where the interpreter cannot show it (no streaming, no tools)."""

    cold_start_ms: float  # factory() and start(): process spawn until the runtime is ready
    first_execute_ms: float  # the first execute after start (imports, caches)
    execute_ms: float  # ``x = i; print(x * 2)``
    tool_call_ms: float | None  # an execute making one host-tool round trip
    variable_1mb_ms: float  # an execute that receives a fresh 1 MB string variable
    stream_latency_ms: float | None  # print() inside the sandbox until the host observer has the text

    def as_row(self) -> dict[str, Any]:
        return {key: None if value is None else round(value, 2) for key, value in asdict(self).items()}


class _Arrivals:
    """A SandboxObserver that keeps when each chunk of output arrived (wall clock, as the sandbox prints it)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, str]] = []

    def on_output(self, stream: str, text: str) -> None:
        self.chunks.append((time.time(), text))

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass


def _ms(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def measure(factory: Callable[[], Any], *, repeats: int = 20) -> Figures:
    """Run the standard probes on one interpreter from ``factory`` and shut it down."""
    holder: dict[str, Any] = {}

    def cold() -> None:
        holder["interp"] = interp = factory()
        interp.start()

    cold_ms = _ms(cold)
    interp = holder["interp"]
    try:
        first_ms = _ms(lambda: interp.execute("x = 0"))
        for i in range(repeats):  # let the JIT settle (V8 tiers WebAssembly up in the background)
            interp.execute(f"x = {i}; print(x * 2)")
        execute = [_ms(partial(interp.execute, f"x = {i}; print(x * 2)")) for i in range(repeats)]
        tools: list[float] = []
        if hasattr(interp, "tools"):
            interp.tools["ping"] = lambda: "pong"
            tools = [_ms(lambda: interp.execute("ping()")) for _ in range(repeats)]
        big = [_ms(partial(interp.execute, "len(big)", variables={"big": "x" * (1 << 20) + str(i)}))
               for i in range(max(3, repeats // 4))]
        latency: list[float] = []
        for _ in range(max(3, repeats // 4)):
            arrivals = _Arrivals()
            token = observer.set(arrivals)
            try:
                interp.execute(_STREAM_CODE)
            finally:
                observer.reset(token)
            for arrived, text in arrivals.chunks[:1]:
                latency.append((arrived - float(text.strip().splitlines()[0])) * 1000)
    finally:
        interp.shutdown()
    return Figures(cold_ms, first_ms, statistics.median(execute), statistics.median(tools) if tools else None,
                   statistics.median(big), statistics.median(latency) if latency else None)


def bench_pyodide(*, repeats: int = 20, home: Path | None = None) -> Figures:
    """Figures for the Pyodide backend (needs Deno and the prefetched Pyodide cache)."""
    from fleet_kernel.sandbox.pyodide import open_pyodide

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        settings = Settings(home=home or Path(tmp) / "home", database_url="sqlite://", sandbox="pyodide")
        factory = open_pyodide(settings, Path(tmp) / "workspace")
        try:
            return measure(factory, repeats=repeats)
        finally:
            factory.close()


if __name__ == "__main__":
    print(bench_pyodide().as_row())
