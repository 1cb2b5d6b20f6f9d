"""Sandbox benchmark: Fleet's backends side by side with dspy.LocalInterpreter, in one run.

    .venv/bin/python bench/sandbox.py [--runs 30]

Cold start (new interpreter to its first result), per-execute latency, an execute with one host tool
call, a 1 MB variable injected and round-tripped, and how long printed output takes to reach the host
while the code still runs (dspy.LocalInterpreter returns output only when the code ends), and how soon an
interrupt stops running code (the tests only bound it loosely, so the figure lives here).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
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


def bench_local(runs: int) -> dict[str, Any] | str:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        settings = load_settings({"FLEET_HOME": tmp, "FLEET_SANDBOX": "local"})
        if not (local := status(settings)).ok:
            return local.detail
        factory = open_sandbox(settings, Path(tmp) / "workspace")
        try:
            return measure(factory, runs)
        finally:
            factory.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    rows: list[tuple[str, dict[str, Any] | str]] = []
    rows.append(("Fleet local (bubblewrap)", bench_local(args.runs)))
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


if __name__ == "__main__":
    main()
