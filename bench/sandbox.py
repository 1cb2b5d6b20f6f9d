"""Sandbox benchmark: Fleet's backends side by side with dspy.LocalInterpreter, in one run.

    .venv/bin/python bench/sandbox.py [--runs 30]

Cold start (new interpreter to its first result), per-execute latency, an execute with one host tool
call, a 1 MB variable injected and round-tripped, and how long printed output takes to reach the host
while the code still runs (dspy.LocalInterpreter returns output only when the code ends), and how soon an
interrupt stops running code (the tests only bound it loosely, so the figure lives here). Then the CPU a
start costs (what every new session's sandbox, or the pool's refill after it, costs the machine), beside
dspy.LocalInterpreter's worker start.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "daytona"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import dspy  # noqa: E402
from sandbox_probes import bench_pyodide, measure  # noqa: E402

from fleet_kernel.config import load_settings  # noqa: E402
from fleet_kernel.sandbox import open_sandbox, status  # noqa: E402

COLUMNS = [
    ("cold_start_ms", "cold start"),
    ("execute_ms", "execute"),
    ("execute_with_tool_call_ms", "+1 tool call"),
    ("round_trip_1mb_variable_ms", "1 MB round trip"),
    ("stream_latency_median_ms", "stream latency"),
    ("interrupt_ms", "interrupt"),
]


def on_local(probe: Any, runs: int, config: str = "") -> Any:
    """``probe(factory, runs)`` on the local backend in a throwaway home (``config``: its fleet.toml), or why
    that backend cannot run here."""
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        env = {"FLEET_HOME": tmp, "FLEET_SANDBOX": "local"}
        if config:
            (Path(tmp) / "fleet.toml").write_text(config)
            env["FLEET_CONFIG"] = str(Path(tmp) / "fleet.toml")
        settings = load_settings(env)
        if not (local := status(settings)).ok:
            return local.detail
        factory = open_sandbox(settings, Path(tmp) / "workspace")
        try:
            return probe(factory, runs)
        finally:
            factory.close()


def boot_cpu(make: Any, runs: int) -> float:
    """CPU milliseconds (user + system) of the processes that one start, first execution and stop leaves
    behind: what ended and was waited for (``RUSAGE_CHILDREN``), read after the stops' reaping."""

    def children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def once() -> None:
        interpreter = make()
        interpreter.execute("x = 0")
        interpreter.shutdown()

    once()  # warm-up: imports, the sandbox probe
    time.sleep(1)
    before = children()
    for _ in range(runs):
        once()
    time.sleep(1)  # a stopped sandbox is reaped on a thread, off the turn's path
    return (children() - before) * 1000 / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    rows: list[tuple[str, dict[str, Any] | str]] = []
    rows.append(("Fleet local (bubblewrap)", on_local(measure, args.runs)))
    try:
        rows.append(("Fleet pyodide", bench_pyodide(args.runs)))
    except Exception as exc:  # noqa: BLE001 - a missing backend is a row, not a crash
        rows.append(("Fleet pyodide", f"unavailable: {exc}"))
    try:
        from bench_fake import bench_daytona_fake

        rows.append(("Fleet daytona (loopback fake)", bench_daytona_fake(args.runs)))
    except Exception as exc:  # noqa: BLE001
        rows.append(("Fleet daytona (loopback fake)", f"unavailable: {exc}"))
    rows.append(("dspy.LocalInterpreter (no isolation)", measure(dspy.LocalInterpreter, args.runs)))

    print(f"\nSandboxes, median milliseconds ({args.runs} runs)\n")
    header = f"{'backend':<38}" + "".join(f" | {title:>15}" for _, title in COLUMNS)
    print(header)
    print("-" * len(header))
    for name, figures in rows:
        if isinstance(figures, str):
            print(f"{name:<38} | {figures}")
            continue
        cells = []
        for key, _ in COLUMNS:
            value = figures.get(key)
            missing = "at end only" if key.startswith("stream") else "n/a"
            cells.append(f" | {missing:>15}" if value is None else f" | {value:>15.2f}")
        print(f"{name:<38}" + "".join(cells))
    print("\nstream latency: print() inside running code to the host's observer; targets: local cold start < 100 ms")
    print("interrupt: interrupt() to execute() giving up on code sleeping for 30 s (tests allow up to 30 s)")

    print(f"\nCPU of one start, first execution and stop (user + system of its processes, mean of {args.runs})\n")
    fleet = on_local(boot_cpu, args.runs, "[sandbox]\npool_size = 0\n")  # each start a boot, none pooled
    raw = boot_cpu(dspy.LocalInterpreter, args.runs)
    print(f"{'dspy.LocalInterpreter (no isolation)':<38} | {raw:>8.1f} ms")
    if isinstance(fleet, str):
        print(f"{'Fleet local (bubblewrap)':<38} | {fleet}")
    else:
        print(f"{'Fleet local (bubblewrap)':<38} | {fleet:>8.1f} ms  ({fleet / raw:.2f}x)")


if __name__ == "__main__":
    main()
