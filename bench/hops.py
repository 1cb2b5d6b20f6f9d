"""What one thread hop costs the event loop beside running turns: ``asyncio.to_thread`` round trips.

    .venv/bin/python bench/hops.py --samples 200

The server's loop sends each store call, file read and sandbox choice to a worker thread and waits for it.
The hop needs the GIL twice (the worker thread, then the loop), behind every thread that holds it. Turn
threads hold it while they parse LM replies and build events, and let it go while they wait on a socket or
a pipe. Each row times a no-op hop beside that many threads of one kind:

- ``pure Python``: threads that never wait (the worst case: a turn parsing a reply that came at once);
- ``waits too``: threads that let the GIL go after every 1,000 steps, as a turn does between chunks.

The POST's path to a turn's first event is made of such hops (``docs/architecture.md``, Performance).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time


def busy(stop: threading.Event, waits: bool) -> None:
    """Run Python until ``stop``; with ``waits``, give the GIL up every 1,000 steps."""
    steps = 0
    while not stop.is_set():
        for _ in range(1000):
            steps += 1
        if waits:
            time.sleep(0)


async def hops(samples: int) -> list[float]:
    """``samples`` no-op round trips to a worker thread, 5 ms apart, in ms."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        await asyncio.to_thread(lambda: None)
        times.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(0.005)
    return sorted(times)


def beside(threads: int, waits: bool, samples: int) -> list[float]:
    stop = threading.Event()
    running = [threading.Thread(target=busy, args=(stop, waits), daemon=True) for _ in range(threads)]
    for thread in running:
        thread.start()
    try:
        return asyncio.run(hops(samples))
    finally:
        stop.set()
        for thread in running:
            thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    print(f"\nA no-op asyncio.to_thread round trip, ms ({args.samples} samples each)\n")
    print(f"{'beside':>24} | {'median':>8} | {'p95':>8}")
    print("-" * 46)
    for threads, waits in ((0, False), (2, True), (8, True), (2, False), (8, False)):
        kind = "" if threads == 0 else " (waits too)" if waits else " (pure Python)"
        times = beside(threads, waits, args.samples)
        p95 = times[int(len(times) * 0.95)]
        print(f"{f'{threads} threads{kind}':>24} | {statistics.median(times):8.2f} | {p95:8.2f}")


if __name__ == "__main__":
    main()
