"""Engine benchmark: Fleet turns vs raw dspy.RLM + dspy.LocalInterpreter, same scripted LM, one run.

    .venv/bin/python bench/engine.py [--repeat 5] [--tracing]

Prints wall time per turn for 1, 5 and 20 iterations, the per-iteration cost (slope between 1 and 20),
and sandbox cold start / per-execute latency; with ``--tracing``, also a 20-iteration turn with OpenTelemetry
traces on (exported to a loopback OTLP receiver) against off, alternating (target: within 5%). Fleet adds isolation, streaming and persistence; the
target is a per-iteration overhead within 1.5x of the baseline and a sandbox cold start under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "telemetry"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from scripted_lm import ScriptedLM, step  # noqa: E402

from fleet_kernel.config import load_settings  # noqa: E402
from fleet_kernel.engine import TurnRunner  # noqa: E402
from fleet_kernel.engine.turn import FleetTask  # noqa: E402
from fleet_kernel.sandbox import open_sandbox  # noqa: E402
from fleet_kernel.store import Store  # noqa: E402

ITERATIONS = (1, 5, 20)


def script(n: int) -> list[dict]:
    return [step(f"step {i}", f"x_{i} = {i} * 2\nprint(x_{i})") for i in range(n - 1)] + [
        step("done", "SUBMIT(answer='done')")
    ]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_raw(lm_url: str, server: ScriptedLM, n: int, repeat: int) -> float:
    lm = dspy.LM("openai/scripted", api_base=lm_url, api_key="sk-bench", cache=False, num_retries=0)
    samples = []
    for _ in range(repeat):
        server.add("*", script(n))
        rlm = dspy.RLM(FleetTask, max_iters=n + 1, interpreter_factory=dspy.LocalInterpreter)
        started = time.perf_counter()
        with dspy.context(lm=lm):
            rlm(task="bench", history="", workspace="")
        samples.append(time.perf_counter() - started)
    return median_ms(samples)


async def bench_fleet(env: dict[str, str], server: ScriptedLM, n: int, repeat: int) -> tuple[float, float]:
    """Median wall time of a whole turn, and median time from start() to the first event."""
    settings = load_settings(env)
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    session = await store.create_session()
    samples, first = [], []
    try:
        for _ in range(repeat):
            server.add("*", script(n))
            started = time.perf_counter()
            handle = await runner.start(session.session_id, "bench")
            first_seen = None
            async for _event in handle.events():
                first_seen = first_seen or time.perf_counter()
            samples.append(time.perf_counter() - started)
            first.append(first_seen - started)
    finally:
        await runner.close()
        await store.close()
    return median_ms(samples), median_ms(first)


def bench_tracing(env: dict[str, str], server: ScriptedLM, repeat: int) -> tuple[float, float, int]:
    """Median 20-iteration turn with traces off and on (alternating runs), and the spans the receiver got."""
    from otlp_receiver import OTLPReceiver

    off, on = [], []
    with OTLPReceiver() as collector:
        traced = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint}
        for _ in range(repeat):
            off.append(asyncio.run(bench_fleet(env, server, 20, 1))[0])
            os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = collector.endpoint  # the SDK reads it here
            try:
                on.append(asyncio.run(bench_fleet(traced, server, 20, 1))[0])
            finally:
                del os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        collector.wait_for(lambda spans: sum(s.name == "fleet.turn" for s in spans) >= repeat)
        return statistics.median(off), statistics.median(on), len(collector.spans)


def bench_interpreter(make, repeat: int) -> tuple[float, float]:
    """Median cold start (first execute on a fresh interpreter) and per-execute latency."""
    cold, warm = [], []
    for _ in range(repeat):
        interp = make()
        started = time.perf_counter()
        interp.execute("x = 1")
        cold.append(time.perf_counter() - started)
        for i in range(20):
            started = time.perf_counter()
            interp.execute(f"x = {i}; print(x * 2)")
            warm.append(time.perf_counter() - started)
        interp.shutdown()
    return median_ms(cold), median_ms(warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tracing", action="store_true", help="also time a 20-iteration turn traced vs not")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="fleet-bench-")
    with ScriptedLM() as server:
        env = {**os.environ, "FLEET_HOME": home, **server.env()}
        env.pop("FLEET_SANDBOX", None)
        settings = load_settings(env)
        rows = []
        for n in ITERATIONS:
            raw = bench_raw(server.base_url, server, n, args.repeat)
            fleet, first = asyncio.run(bench_fleet(env, server, n, args.repeat))
            rows.append((n, raw, fleet, first))
        factory = open_sandbox(settings, Path(home) / "bench-workspace")
        try:
            fleet_cold, fleet_exec = bench_interpreter(factory, args.repeat)
        finally:
            factory.close()
        raw_cold, raw_exec = bench_interpreter(dspy.LocalInterpreter, args.repeat)
        tracing = bench_tracing(env, server, args.repeat) if args.tracing else None

    print(f"\nEngine: Fleet ({settings.sandbox or 'local'} sandbox, store, events) vs raw dspy.RLM + LocalInterpreter")
    print(f"scripted OpenAI-compatible LM on loopback, median of {args.repeat}\n")
    print(f"{'iterations':>10} | {'raw dspy.RLM (ms)':>18} | {'Fleet turn (ms)':>16} | {'Fleet first event (ms)':>22}")
    print("-" * 76)
    for n, raw, fleet, first in rows:
        print(f"{n:>10} | {raw:>18.1f} | {fleet:>16.1f} | {first:>22.1f}")
    raw_slope = (rows[-1][1] - rows[0][1]) / (ITERATIONS[-1] - ITERATIONS[0])
    fleet_slope = (rows[-1][2] - rows[0][2]) / (ITERATIONS[-1] - ITERATIONS[0])
    print(f"\nper iteration: raw {raw_slope:.2f} ms, Fleet {fleet_slope:.2f} ms "
          f"(ratio {fleet_slope / raw_slope:.2f}x; target <= 1.5x)")  # fmt: skip
    print(f"\n{'sandbox':>26} | {'cold start (ms)':>15} | {'per execute (ms)':>16}")
    print("-" * 64)
    print(f"{'Fleet ' + (settings.sandbox or 'local'):>26} | {fleet_cold:>15.1f} | {fleet_exec:>16.2f}")
    print(f"{'dspy.LocalInterpreter':>26} | {raw_cold:>15.1f} | {raw_exec:>16.2f}")
    print("\ntarget: sandbox cold start < 100 ms")
    if tracing is not None:
        off, on, spans = tracing
        print(f"\n20-iteration turn, traces off {off:.1f} ms, on {on:.1f} ms ({(on - off) / off * 100:+.1f}%; "
              f"{spans} spans received; target within 5%)")


if __name__ == "__main__":
    main()
