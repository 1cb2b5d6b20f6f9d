"""Kernel benchmark: the ``fleet`` kernel side by side with a stock ``python3`` ipykernel, over ZMQ.

    .venv/bin/python bench/kernel.py [--repeat 5]

Measures, as a frontend sees them:
- start to ready: launching the kernel process until its ``kernel_info_reply`` (what Lab/console wait for);
- execute round trip: ``execute_request`` to ``execute_reply`` for a cell that does nothing costly
  (``pass`` for python3; ``%fleet output`` for fleet, a command that never calls the model);
- first streamed event: ``execute_request`` to the first output of the cell (``print`` for python3; the
  first live display of a turn for fleet, on the scripted LM), on a warm kernel, and for the kernel's first turn;
- first cell vs warm cell side by side: the first cell is sent right after ``kernel_info``, while the
  kernel still loads dspy in the background; a warm cell runs once that is done.

- a 1-iteration ``%%fleet`` turn in a python3 kernel with a 10 MB ``--in`` string against one with a
  small one: what passing a value costs (``--magic-only`` runs just this).

Targets: start within 1.3x of stock ipykernel; first event of a turn under 50 ms; a fresh kernel's
first cell within 50 ms of a warm kernel's, execute to first turn event (issue 31).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_client.manager import start_new_kernel  # noqa: E402
from scripted_lm import ScriptedLM, step  # noqa: E402

from fleet_kernel.kernel.install import install  # noqa: E402

OUTPUTS = {"stream", "display_data", "execute_result", "update_display_data", "error"}


def start(name: str, env: dict[str, str]) -> tuple[Any, Any, float]:
    began = time.perf_counter()
    km, kc = start_new_kernel(kernel_name=name, env=env, startup_timeout=60)
    return km, kc, time.perf_counter() - began


def execute(kc: Any, code: str) -> tuple[float, float | None, float | None]:
    """``(round trip, first output, first output showing a turn event)`` of one cell, in seconds.

    The fleet kernel shows "starting the turn…" at once; the third time is when the first event of the
    turn (``turn.started``) is on screen.
    """
    began = time.perf_counter()
    msg_id = kc.execute(code)
    first = event = None
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in OUTPUTS:
            now = time.perf_counter() - began
            first = first if first is not None else now
            if event is None and "starting the turn" not in str(msg["content"]):
                event = now
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
        pass
    return time.perf_counter() - began, first, event


def wait_warm(kc: Any) -> None:
    """Wait until the fleet kernel has loaded the engine in the background."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg_id = kc.execute("%fleet status", silent=False)
        text = ""
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "display_data":
                text += msg["content"]["data"]["text/plain"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        if "engine loaded: yes" in text:
            return
        time.sleep(0.2)


def bench(name: str, env: dict[str, str], repeat: int, noop: str, first_output: str) -> dict[str, Any]:
    """Medians over ``repeat`` fresh kernels (each one's first cell), and the warm cells of the first kernel."""
    starts, trips, firsts, events, colds, cold_events = [], [], [], [], [], []
    for i in range(repeat):
        km, kc, elapsed = start(name, env)
        starts.append(elapsed)
        try:
            _, cold, cold_event = execute(kc, first_output)  # sent right after kernel_info
            colds.append(cold)
            cold_events.append(cold_event)
            if i == 0:
                if name != "python3":
                    wait_warm(kc)
                for _ in range(10):
                    trips.append(execute(kc, noop)[0])
                for _ in range(5):
                    _, first, event = execute(kc, first_output)
                    firsts.append(first)
                    events.append(event)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return {
        "start": statistics.median(starts),
        "trip": statistics.median(trips),
        "first": statistics.median(f for f in firsts if f is not None),
        "cold": statistics.median(c for c in colds if c is not None),
        "event": statistics.median(e for e in events if e is not None),
        "cold_event": statistics.median(e for e in cold_events if e is not None),
    }


def magic_bench(env: dict[str, str], repeat: int) -> tuple[float, float]:
    """Medians of a warm 1-iteration ``%%fleet`` turn's round trip: ``(small input, 10 MB input)``."""
    km, kc, _ = start("python3", env)
    try:
        for setup in ("%load_ext fleet_kernel", "small = 'x'\nbig = 'x' * 10_000_000", "%%fleet\nwarm up"):
            execute(kc, setup)
        small, big = [], []
        for _ in range(repeat):
            small.append(execute(kc, "%%fleet --in small\nbench a small input")[0])
            big.append(execute(kc, "%%fleet --in big\nbench a big input")[0])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return statistics.median(small), statistics.median(big)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="kernel starts per kernel")
    parser.add_argument("--magic-only", action="store_true", help="only the %%%%fleet input-variable line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ScriptedLM(default=step("answer", "SUBMIT(answer='ok')")) as lm:
        install(prefix=tmp, name="fleet-bench")
        os.environ["JUPYTER_PATH"] = f"{tmp}/share/jupyter"
        env = {**os.environ, "JUPYTER_PATH": f"{tmp}/share/jupyter", "FLEET_HOME": f"{tmp}/home", **lm.env()}
        small, big = magic_bench(env, args.repeat)
        magic_line = (
            f"%%fleet 1-iteration turn (python3 kernel): --in 1 char {small * 1000:8.1f}ms, "
            f"--in 10 MB {big * 1000:8.1f}ms (+{(big - small) * 1000:.1f}ms)"
        )
        if args.magic_only:
            print(magic_line)
            return
        stock = bench("python3", env, args.repeat, "pass", "print('x')")
        fleet = bench("fleet-bench", env, args.repeat, "%fleet output", "what is 2+2?")
    rows = [
        ("start to ready", "start", "within 1.3x of stock"),
        ("execute round trip (no LM)", "trip", ""),
        ("execute -> first output (warm)", "first", ""),
        ("execute -> first turn event (warm)", "event", "fleet < 50 ms"),
        ("execute -> first output (first cell)", "cold", ""),
        ("execute -> first turn event (first cell)", "cold_event", ""),
    ]
    print(f"{'':42} {'python3':>10} {'fleet':>10} {'ratio':>7}  target")
    for label, key, target in rows:
        a, b = stock[key] * 1000, fleet[key] * 1000
        print(f"{label:42} {a:8.1f}ms {b:8.1f}ms {b / a:6.2f}x  {target}")
    print("\nexecute -> first turn event (python3: first output), fresh kernel vs warm kernel:")
    print(f"{'':42} {'first cell':>10} {'warm cell':>10} {'vs python3 first cell':>22}")
    for label, result in (("python3 (stock ipykernel)", stock), ("fleet", fleet)):
        first, warm = result["cold_event"] * 1000, result["event"] * 1000
        print(f"{label:42} {first:8.1f}ms {warm:8.1f}ms {first / (stock['cold_event'] * 1000):21.1f}x")
    gap = (fleet["cold_event"] - fleet["event"]) * 1000
    print(f"fleet first cell - warm cell: {gap:+.1f} ms (target, issue 31: within 50 ms)")
    print(f"\n{magic_line}")
    ok_start = fleet["start"] <= 1.3 * stock["start"]
    ok_first = fleet["event"] < 0.050
    print(f"\nstart within 1.3x: {'yes' if ok_start else 'NO'}; first event under 50 ms: {'yes' if ok_first else 'NO'}")


if __name__ == "__main__":
    main()
