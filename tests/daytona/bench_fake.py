"""Figures for the Daytona backend against the loopback fake: ``bench_daytona_fake()`` (used by bench/sandbox.py).

    python tests/daytona/bench_fake.py      # prints the figures as JSON

The fake runs on this machine, so these show Fleet's own overhead (SDK, WebSocket per execute,
marker framing, inbox polling), not Daytona's network latency or sandbox start time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from sandbox_probes import STREAM_CODE, Arrivals, median, ms  # bench/, on the path above


def bench_daytona_fake(runs: int = 30) -> dict[str, float]:
    """Cold start, per-execute latency, 1 MB round trip and streaming latency, in milliseconds.

    ``cold_start_ms``: new sandbox (volume, create, workspace sync) to the first execute's result, SDK already
    imported (``sdk_import_ms`` is that import alone, in a fresh process). ``warm_turn_start_ms``: the next
    turn in the same session, to its first result (a new context on the warm sandbox).
    """
    import_s = float(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import time; t = time.perf_counter(); from daytona import Daytona; print(time.perf_counter() - t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    from daytona import Daytona  # noqa: F401 - loaded before the clock starts; its cost is reported alone
    from fake_server import FakeDaytona

    from fleet_kernel.config import load_settings
    from fleet_kernel.sandbox import base
    from fleet_kernel.sandbox.daytona import open_daytona
    from fleet_kernel.workspace import Workspace

    with tempfile.TemporaryDirectory() as home, FakeDaytona() as fake:
        settings = load_settings(
            {
                "FLEET_HOME": home,
                "FLEET_SANDBOX": "daytona",
                "FLEET_DAYTONA_API_KEY": fake.api_key,
                "FLEET_DAYTONA_API_URL": fake.api_url,
            }
        )
        workspace = Workspace.for_session(settings.workspaces_dir, "bench").root
        started = time.perf_counter()
        factory = open_daytona(settings, workspace)
        interp = factory()
        interp.execute("x = 0")
        cold = time.perf_counter() - started
        factory.close()

        started = time.perf_counter()
        factory = open_daytona(settings, workspace)
        interp = factory()
        interp.execute("x = 0")
        warm = time.perf_counter() - started
        interp.tools["echo"] = lambda value: value

        execute = median(lambda: interp.execute("x += 1"), runs)
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
        factory.close()
    return {
        "sdk_import_ms": ms(import_s),
        "cold_start_ms": ms(cold),
        "warm_turn_start_ms": ms(warm),
        "execute_ms": ms(execute),
        "execute_with_tool_call_ms": ms(tool),
        "inject_1mb_variable_ms": ms(inject),
        "round_trip_1mb_variable_ms": ms(round_trip),
        "stream_latency_median_ms": ms(statistics.median(arrivals.delays)),
        "stream_latency_max_ms": ms(max(arrivals.delays)),
    }


if __name__ == "__main__":
    print(json.dumps(bench_daytona_fake(), indent=2))
