"""Benchmark of the HTTP front door: latency and throughput of turns and their SSE streams.

    .venv/bin/python bench/api.py            # full run, prints a table
    .venv/bin/python bench/api.py --quick    # fewer samples

Two `fleet serve` processes share one store (SQLite in a temp FLEET_HOME, or FLEET_BENCH_DATABASE_URL):
A serves every watcher; turns run on A ("in-process": events reach watchers through A's in-memory
hub) or on B ("cross-process": A tails them from the store). The LM is the scripted one from
tests/, so numbers measure Fleet, not a provider. Turns run in the configured sandbox (local
bubblewrap by default).

Event latency is reported two ways. "emit->delivery" runs from the event's own ``ts`` (stamped when
the engine emits it, before its batch is committed) to its arrival at the client: what a user feels,
and an upper bound of commit->delivery. "commit->delivery" runs from the moment a separate
"commit clock" process, polling the store every 2 ms, first sees the row, to its arrival (a slight
underestimate, by at most the polling period and one query).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from scripted_lm import step  # noqa: E402

from fleet_kernel.events import TurnCompleted  # noqa: E402
from fleet_kernel.kernel.sidecar import spawn_sidecar  # noqa: E402

TARGET_FIRST_EVENT_MS = 20.0
TARGET_CROSS_P95_MS = 100.0


# ---------------------------------------------------------------------- SSE client


@dataclass
class Watch:
    started: float
    connected_wall: float = field(default_factory=time.time)
    arrivals: list[float] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    live: list[tuple[str, int, float]] = field(default_factory=list)  # (turn_id, seq, arrival wall time)
    last_type: str = ""


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()  # Python 3.11 reads the trailing Z


async def consume(response: httpx.Response, watch: Watch) -> Watch:
    """Read frames until the stream ends, noting each event's arrival and lag behind its ``ts``."""
    import json

    async for line in response.aiter_lines():
        if line.startswith("data: "):
            now = time.time()
            envelope = json.loads(line[6:])
            watch.arrivals.append(time.perf_counter())
            emitted = _ts(envelope["ts"])
            if emitted >= watch.connected_wall:  # live, not replayed from before the watcher connected
                watch.lags_ms.append((now - emitted) * 1000)
                watch.live.append((envelope["turn_id"], envelope["seq"], now))
            watch.last_type = envelope["type"]
    return watch


async def watch_turn(client: httpx.AsyncClient, session_id: str, turn_id: str) -> Watch:
    watch = Watch(time.perf_counter())
    async with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as response:
        return await consume(response, watch)


async def new_session(client: httpx.AsyncClient) -> str:
    return str((await client.post("/api/sessions", json={"title": "bench"})).json()["session_id"])


async def start_async(client: httpx.AsyncClient, session_id: str, task: str) -> str:
    response = await client.post(
        f"/api/sessions/{session_id}/turns", json={"task": task}, headers={"Prefer": "respond-async"}
    )
    response.raise_for_status()
    return str(response.json()["turn_id"])


def script(iterations: int, *, delay_s: float = 0.0, lines: int = 1) -> list[dict[str, object]]:
    code = "\n".join(f"print('line {i}')" for i in range(lines))
    steps = [
        {"delay": delay_s, **step(f"Step {i}.", code)} if delay_s else step(f"Step {i}.", code)
        for i in range(iterations)
    ]
    return [*steps, step("Done.", "SUBMIT(answer='ok')")]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ---------------------------------------------------------------------- measurements


async def first_event(a: httpx.AsyncClient, samples: int) -> list[float]:
    """Milliseconds from sending POST .../turns to reading its first event (turn.started)."""
    latencies = []
    for i in range(samples):
        task = f"first-event sample {i}"
        session_id = await new_session(a)
        sent = time.perf_counter()
        async with a.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": task}) as response:
            watch = Watch(sent)
            async for line in response.aiter_lines():
                if line.startswith("data: ") and not watch.arrivals:
                    watch.arrivals.append(time.perf_counter())
        latencies.append((watch.arrivals[0] - sent) * 1000)
    return latencies


async def fan_out(a: httpx.AsyncClient, watchers: int) -> tuple[float, float, int]:
    """Events/s delivered to ``watchers`` clients of one turn: live (while it runs) and replayed after."""
    task = f"fan-out to {watchers}"
    session_id = await new_session(a)
    turn_id = await start_async(a, session_id, task)
    live = await asyncio.gather(*(watch_turn(a, session_id, turn_id) for _ in range(watchers)))
    delivered = sum(len(w.arrivals) for w in live)
    live_rate = delivered / (max(w.arrivals[-1] for w in live) - min(w.started for w in live))
    begin = time.perf_counter()
    replay = await asyncio.gather(*(watch_turn(a, session_id, turn_id) for _ in range(watchers)))
    replay_rate = sum(len(w.arrivals) for w in replay) / (time.perf_counter() - begin)
    return live_rate, replay_rate, len(live[0].arrivals)


async def concurrent_turns(
    runner: httpx.AsyncClient,
    watcher: httpx.AsyncClient,
    label: str,
    turns: int,
    clock: CommitClock,
) -> dict[str, float]:
    """``turns`` turns on as many sessions at once, each with a 50 ms LM, watched through ``watcher``."""
    sessions = [await new_session(watcher) for _ in range(turns)]
    tasks = [f"{label} concurrent turn {i}" for i in range(turns)]
    begin = time.perf_counter()

    async def start_and_watch(session_id: str, task: str) -> Watch:
        # Watch from the moment the turn exists, as a client that starts it on one server and follows it on another.
        return await watch_turn(watcher, session_id, await start_async(runner, session_id, task))

    watches = await asyncio.gather(*(start_and_watch(s, t) for s, t in zip(sessions, tasks, strict=True)))
    elapsed = time.perf_counter() - begin
    lags = [lag for w in watches for lag in w.lags_ms]
    completed = sum(w.last_type == TurnCompleted.type for w in watches)
    seen = clock.read()
    commit_lags = [(t - seen[(turn, seq)]) * 1000 for w in watches for turn, seq, t in w.live if (turn, seq) in seen]
    return {
        "commit_p50_ms": pct(commit_lags, 0.50),
        "commit_p95_ms": pct(commit_lags, 0.95),
        "turns_per_s": completed / elapsed,
        "events_per_s": sum(len(w.arrivals) for w in watches) / elapsed,
        "p50_ms": pct(lags, 0.50),
        "p95_ms": pct(lags, 0.95),
        "max_ms": max(lags),
        "completed": completed,
        "elapsed_s": elapsed,
    }


# ---------------------------------------------------------------------- commit clock

CLOCK_SQLITE = """
import json, signal, sqlite3, sys, time
db, out = sys.argv[1], sys.argv[2]
seen, last, running = {}, 0, True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
conn = sqlite3.connect(db, timeout=30)
while running:
    try:
        rows = conn.execute("SELECT rowid, turn_id, seq FROM events WHERE rowid > ? ORDER BY rowid", (last,)).fetchall()
    except sqlite3.OperationalError:
        rows = []
    now = time.time()
    for rowid, turn, seq in rows:
        seen[f"{turn} {seq}"] = now
        last = rowid
    time.sleep(0.002)
json.dump(seen, open(out, "w"))
"""

# PostgreSQL rows have no insertion order to poll by; each turn's ``last_seq`` (updated in the same
# transaction as its events) is polled instead: a small table, so the clock does not load the server.
CLOCK_POSTGRES = """
import asyncio, json, signal, sys, time
import asyncpg
dsn, out = sys.argv[1], sys.argv[2]
seen, top, running = {}, {}, True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
async def main():
    conn = await asyncpg.connect(dsn)
    while running:
        rows = await conn.fetch("SELECT turn_id, last_seq FROM turns")
        now = time.time()
        for row in rows:
            for seq in range(top.get(row["turn_id"], 0) + 1, row["last_seq"] + 1):
                seen[f"{row['turn_id']} {seq}"] = now
            top[row["turn_id"]] = row["last_seq"]
        await asyncio.sleep(0.002)
    await conn.close()
asyncio.run(main())
json.dump(seen, open(out, "w"))
"""


class CommitClock:
    """A separate process that notes when each event row first becomes visible in the store."""

    def __init__(self, database_url: str, out: Path) -> None:
        import subprocess

        self.out = out
        if database_url.startswith("sqlite"):
            code, target = CLOCK_SQLITE, database_url.split(":///", 1)[1]
        else:
            code, target = CLOCK_POSTGRES, database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
        self.process = subprocess.Popen([sys.executable, "-c", code, target, str(out)])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def read(self) -> dict[tuple[str, int], float]:
        import json

        self.stop()
        raw = json.loads(self.out.read_text())
        found = {(key.split(" ")[0], int(key.split(" ")[1])): t for key, t in raw.items()}
        return found


# ---------------------------------------------------------------------- driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan(quick: bool) -> dict[str, list[dict[str, object]]]:
    """Every turn's script, by task: the scripted LM runs in its own process and is given them up front."""
    samples, iterations, count = (10, 10, 10) if quick else (30, 20, 20)
    scripts = {name: script(1) for name in ("warm-up A", "warm-up B")}
    scripts |= {f"first-event sample {i}": script(0) for i in range(samples)}
    scripts |= {f"fan-out to {n}": script(iterations, lines=3) for n in (1, 10, 100)}
    for label in ("in-process", "cross-process"):
        scripts |= {f"{label} concurrent turn {i}": script(4, delay_s=0.05) for i in range(count)}
    return scripts


async def run(url_a: str, url_b: str, quick: bool, database_url: str) -> list[tuple[str, str, str]]:
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    rows: list[tuple[str, str, str]] = []
    async with (
        httpx.AsyncClient(base_url=url_a, timeout=120, limits=limits) as a,
        httpx.AsyncClient(base_url=url_b, timeout=120, limits=limits) as b,
    ):
        for client, name in ((a, "warm-up A"), (b, "warm-up B")):  # dspy import, first sandbox
            await watch_turn(client, sid := await new_session(client), await start_async(client, sid, name))

        first = await first_event(a, 10 if quick else 30)
        ok = pct(first, 0.5) < TARGET_FIRST_EVENT_MS
        rows.append(
            (
                "request -> first event (POST .../turns)",
                f"p50 {pct(first, 0.5):.1f} ms, p95 {pct(first, 0.95):.1f} ms, max {max(first):.1f} ms",
                f"< {TARGET_FIRST_EVENT_MS:g} ms: {'met' if ok else 'MISSED'}",
            )
        )
        for n in (1, 10, 100):
            live, replay, events = await fan_out(a, n)
            rows.append(
                (
                    f"{n} SSE watcher(s) of one turn ({events} events)",
                    f"live {live:,.0f} events/s, replay {replay:,.0f} events/s",
                    "",
                )
            )
        count = 10 if quick else 20
        for label, runner in (("in-process", a), ("cross-process", b)):
            clock = CommitClock(database_url, Path(tempfile.mktemp(suffix=".json")))
            try:
                result = await concurrent_turns(runner, a, label, count, clock)
            finally:
                clock.stop()
            target = ""
            if label == "cross-process":
                met = result["commit_p95_ms"] < TARGET_CROSS_P95_MS
                target = f"p95 < {TARGET_CROSS_P95_MS:g} ms: {'met' if met else 'MISSED'}"
            rows += [
                (
                    f"{count} concurrent turns, 50 ms LM, {label}",
                    (
                        f"{result['completed']:.0f} done in {result['elapsed_s']:.2f} s: "
                        f"{result['turns_per_s']:.1f} turns/s, {result['events_per_s']:,.0f} events/s"
                    ),
                    "",
                ),
                (
                    "  event latency commit -> delivery",
                    f"p50 {result['commit_p50_ms']:.1f} ms, p95 {result['commit_p95_ms']:.1f} ms",
                    target,
                ),
                (
                    "  event latency emit -> delivery",
                    f"p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, max {result['max_ms']:.1f} ms",
                    "",
                ),
            ]
    return rows


def print_table(rows: list[tuple[str, str, str]], store: str) -> None:
    head = ("measurement", f"result ({store})", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    line = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    print(line)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print(line)
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(line)


@contextmanager
def scripted_lm(scripts: dict[str, list[dict[str, object]]], folder: str) -> Iterator[str]:
    """The scripted LM in a process of its own, so serving the turns' LM calls does not slow the client."""
    import json
    import subprocess

    spec = Path(folder) / "scripts.json"
    spec.write_text(json.dumps({"scripts": scripts}))
    server = ROOT / "tests" / "scripted_lm.py"
    process = subprocess.Popen([sys.executable, str(server), str(spec)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--home", help="FLEET_HOME to use and keep (logs/api-*.log); default: a temporary one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as scratch, scripted_lm(plan(args.quick), scratch) as url:
        home = args.home or scratch
        env = {
            "FLEET_HOME": home,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "FLEET_LM_MODEL": "openai/scripted",
            "FLEET_LM_BASE_URL": url,
            "FLEET_LM_API_KEY": "sk-scripted-bench-key",
        }
        if os.environ.get("FLEET_BENCH_DATABASE_URL"):
            env["FLEET_DATABASE_URL"] = os.environ["FLEET_BENCH_DATABASE_URL"]
            from fleet_kernel.store import migrate

            migrate.upgrade(env["FLEET_DATABASE_URL"])
        for var in [v for v in os.environ if v.startswith("FLEET_") and v not in env]:
            os.environ.pop(var)
        port_a, port_b = free_port(), free_port()
        servers = []
        try:
            servers = [spawn_sidecar(port_a, env=env)]
            servers.append(spawn_sidecar(port_b, env=env))
            database_url = env.get("FLEET_DATABASE_URL", f"sqlite+aiosqlite:///{Path(home) / 'fleet.db'}")
            rows = asyncio.run(
                run(f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}", args.quick, database_url)
            )
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(30)
        store = "postgresql" if "FLEET_DATABASE_URL" in env else "sqlite"
        print_table(rows, store)


if __name__ == "__main__":
    main()
