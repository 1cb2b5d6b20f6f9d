"""Scale-out benchmark: 1, 2 and 3 ``fleet serve`` replicas on one PostgreSQL database.

    FLEET_DATABASE_URL=postgresql+asyncpg://... .venv/bin/python bench/scale.py [--sessions 100] [--seconds 30]

Each phase starts its replicas (same database, same FLEET_HOME: on one machine the session folders
are shared as a deployment shares them through its sandboxes), and drives ``--sessions`` sessions at
once: each runs a first turn (its sandbox boots; not counted), then, once all have, turn after turn
for ``--seconds``. Sessions are spread round-robin across the
replicas, as a load balancer spreads clients. A turn is two steps of a scripted LM that answers in
``--lm-delay`` seconds (what a real provider does): one that runs code, one that submits.

Every turn's POST streams its events from the replica that runs it; every ``--watch-every``-th turn is
also watched over SSE on the next replica (``GET .../events``): the gap between an event's arrival on
the two streams is the cross-replica delivery time. Lost events: any turn whose streams do not hold
every seq from 1 to its terminal event, on the POST stream or the watcher.

The last phase kills one of 3 replicas with SIGKILL mid-run: the streams it served reconnect to a live
replica with ``Last-Event-ID``, and the table says how soon its turns ended ``interrupted``, whether
any other turn failed, and how soon its sessions ran a new turn on the others.

The CPU columns say where the limit is: cores used by the replicas (their whole process trees,
sandboxes included), by PostgreSQL, and the database's commits per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine import LMProcess, free_port, pct, tree_cpu
from scripted_lm import step

from fleet_kernel.kernel.sidecar import spawn_sidecar
from fleet_kernel.store import migrate

TERMINAL = {"turn.completed", "turn.failed", "turn.cancelled"}


@dataclass
class Turn:
    """What the bench saw of one turn: when each seq arrived on the POST stream and on the watcher."""

    replica: int
    posted: float
    turn_id: str = ""
    first: float | None = None
    seen: dict[int, float] = field(default_factory=dict)
    watched: dict[int, float] = field(default_factory=dict)
    watch_from: float | None = None  # when the watcher's stream was open: later events count for delivery
    last: str = ""  # its terminal event type
    error: str = ""  # the terminal event's error type (interrupted, ...)
    cut: bool = False  # its POST stream was cut by the kill
    ended: float | None = None


@dataclass
class Phase:
    replicas: int
    turns: list[Turn] = field(default_factory=list)
    took: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # cores used, by part
    commits: int = 0
    killed_at: float | None = None
    retaken: list[float] = field(default_factory=list)  # kill -> a dead replica's session's next turn started


class Replicas:
    """``fleet serve`` processes on free loopback ports; ``live`` is the indexes not killed."""

    def __init__(self, count: int, env: dict[str, str]) -> None:
        self.processes, self.urls = [], []
        for _ in range(count):
            port = free_port()
            self.processes.append(spawn_sidecar(port, env=env, wait_s=120))
            self.urls.append(f"http://127.0.0.1:{port}")
        self.live = list(range(count))

    def kill(self, index: int) -> None:
        self.live.remove(index)
        os.killpg(self.processes[index].pid, signal.SIGKILL)  # its sandboxes' stages go with it
        self.processes[index].wait(20)

    def close(self) -> None:
        for index in self.live:
            self.processes[index].terminate()
        for index in self.live:
            self.processes[index].wait(30)

    def cpu(self) -> dict[int, float]:
        """CPU seconds so far of each live replica's process tree (its sandboxes included)."""
        return {i: tree_cpu(psutil.Process(self.processes[i].pid)) for i in self.live}


def postgres_cpu() -> float:
    """CPU seconds of the PostgreSQL server's processes (those of the postgres user) still alive."""
    total = 0.0
    for process in psutil.process_iter(["username", "name"]):
        if process.info["username"] == "postgres":
            try:
                t = process.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                continue
    return total


async def frames(response: httpx.Response):  # type: ignore[no-untyped-def]
    """``(id, event, data)`` of each SSE frame."""
    seq, event, data = None, None, ""
    async for line in response.aiter_lines():
        if not line:
            if event is not None:
                yield seq, event, data
            seq, event, data = None, None, ""
        elif line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]


class Driver:
    def __init__(self, replicas: Replicas, lm: LMProcess, phase: Phase, args: argparse.Namespace) -> None:
        self.replicas, self.lm, self.phase, self.args = replicas, lm, phase, args
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.clients = [httpx.AsyncClient(base_url=u, timeout=120, limits=limits) for u in replicas.urls]
        self.kill_after = args.seconds / 3 if phase.replicas > 1 and args.kill else None

    async def read(self, turn: Turn, response: httpx.Response, into: dict[int, float]) -> None:
        async for seq, event, data in frames(response):
            now = time.perf_counter()
            into.setdefault(seq, now)
            if into is turn.seen:
                turn.first = turn.first or now
                turn.turn_id = turn.turn_id or json.loads(data)["turn_id"]
            if event in TERMINAL:
                turn.last, turn.ended = event, turn.ended or now
                turn.error = (json.loads(data)["data"].get("error") or {}).get("type", "")

    async def follow(self, turn: Turn, session_id: str, into: dict[int, float], avoid: int) -> None:
        """Read the turn's events from a live replica other than ``avoid`` after ``Last-Event-ID``, to its end."""
        give_up = time.perf_counter() + 60
        while not turn.last and self.replicas.live and time.perf_counter() < give_up:
            live = [i for i in self.replicas.live if i != avoid] or self.replicas.live
            client = self.clients[min(live, key=lambda i: (i - avoid) % len(self.clients))]  # the next one
            headers = {"Last-Event-ID": str(max(into))} if into else {}
            try:
                async with client.stream(
                    "GET", f"/api/sessions/{session_id}/turns/{turn.turn_id}/events", headers=headers
                ) as response:
                    if into is turn.watched and turn.watch_from is None:
                        turn.watch_from = time.perf_counter()
                    await self.read(turn, response, into)
                return
            except httpx.TransportError:  # that replica was killed too: the next one
                await asyncio.sleep(0.1)

    async def watch(self, turn: Turn, session_id: str) -> None:
        while not turn.turn_id and not turn.last:  # noqa: ASYNC110 - a bench poll of a field the turn sets
            await asyncio.sleep(0.005)
        if turn.turn_id:
            others = [i for i in self.replicas.live if i != turn.replica] or [turn.replica]
            await self.follow(turn, session_id, turn.watched, avoid=-1 if others == [turn.replica] else turn.replica)

    async def session(self, index: int) -> None:
        """One session: a first turn (its sandbox boots), then turns back to back from ``go`` to ``deadline``."""
        home = index % self.phase.replicas
        response = await self.clients[home].post("/api/sessions", json={"title": f"scale {index}"})
        session_id = response.json()["session_id"]
        await self.turn(index, session_id, "first", home)
        self.warming -= 1
        if not self.warming:  # the last first turn: the clock starts
            self.deadline = time.perf_counter() + self.args.seconds
            self.go.set()
        await self.go.wait()
        count, moved = 0, False
        while time.perf_counter() < self.deadline:
            replica = home if home in self.replicas.live else self.replicas.live[index % len(self.replicas.live)]
            turn = await self.turn(index, session_id, f"{count:04d}", replica, watch=count % self.args.watch_every == 0)
            if turn is None:  # 409: the killed replica's turn is not ended yet
                await asyncio.sleep(0.1)
                continue
            if home != replica and not moved and self.phase.killed_at is not None:
                moved = True  # the first turn of a killed replica's session on another one
                self.phase.retaken.append(turn.posted - self.phase.killed_at)
            self.phase.turns.append(turn)
            count += 1

    async def turn(self, index: int, session_id: str, name: str, replica: int, watch: bool = False) -> Turn | None:
        """POST a turn to ``replica`` and read its stream to the end (and watch it on another replica)."""
        task = f"scale-{self.phase.replicas}{'k' if self.kill_after else ''}-{index:03d}-{name}"
        self.lm.add(task, [
            {"delay": self.args.lm_delay, **step("Look.", "print(21 * 2)")},
            {"delay": self.args.lm_delay, **step("Done.", "SUBMIT(answer='42')")},
        ])  # fmt: skip
        turn = Turn(replica, time.perf_counter())
        watcher = asyncio.create_task(self.watch(turn, session_id)) if watch else None
        try:
            async with self.clients[replica].stream(
                "POST", f"/api/sessions/{session_id}/turns", json={"task": task}
            ) as response:
                if response.status_code == 409:
                    await response.aread()
                    if watcher:
                        watcher.cancel()
                    return None
                if response.status_code != 200:  # counted as failed, with its status
                    turn.last = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                else:
                    await self.read(turn, response, turn.seen)
        except httpx.TransportError:
            turn.cut = True
            if turn.turn_id:
                await self.follow(turn, session_id, turn.seen, avoid=replica)
        if watcher:
            await watcher
        return turn

    async def killer(self, began: float) -> None:
        if self.kill_after is None:
            return
        await asyncio.sleep(self.kill_after)
        self.phase.killed_at = time.perf_counter()
        await asyncio.to_thread(self.replicas.kill, self.replicas.live[-1])

    async def run(self) -> None:
        self.go, self.warming = asyncio.Event(), self.args.sessions
        sessions = asyncio.gather(*(self.session(i) for i in range(self.args.sessions)))
        await self.go.wait()  # every session has run its first turn
        began = self.deadline - self.args.seconds
        cpu, pg, bench = self.replicas.cpu(), postgres_cpu(), tree_cpu(psutil.Process())
        commits = await xact_commits(self.args.database_url)
        await asyncio.gather(self.killer(began), sessions)
        self.phase.took = time.perf_counter() - began
        self.phase.cpu = {  # cores used; the killed replica's CPU is left out
            "replicas": sum(after - cpu[i] for i, after in self.replicas.cpu().items()) / self.phase.took,
            "PostgreSQL": (postgres_cpu() - pg) / self.phase.took,
            "bench": (tree_cpu(psutil.Process()) - bench) / self.phase.took,  # SSE clients and the scripted LM
        }
        self.phase.commits = await xact_commits(self.args.database_url) - commits
        for client in self.clients:
            await client.aclose()


async def xact_commits(url: str) -> int:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        return int(await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))
    finally:
        await conn.close()


def lost(turn: Turn) -> int:
    """Seqs missing from the turn's streams: below the highest seq each stream got, and on the watcher up
    to what the POST stream got once the watcher reached its end. A turn with no terminal event is
    counted under "not completed", not here: its stream was still open when the bench stopped waiting."""
    if not turn.seen:
        return 0
    end = max(turn.seen)
    missing = len(set(range(1, end + 1)) - set(turn.seen))
    if turn.watched:
        upto = end if turn.last and max(turn.watched) >= end else max(turn.watched)
        missing += len(set(range(1, upto + 1)) - set(turn.watched))
    return missing


def report(phases: list[Phase], args: argparse.Namespace) -> None:
    print(
        f"\n{args.sessions} sessions at once, 2-step turns, LM answering in {args.lm_delay:g} s, {args.seconds:g} s "
        f"a phase; one PostgreSQL; {os.cpu_count()} cores; load average "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
        + "\n"
    )
    header = (
        f"{'replicas':>8} | {'turns/s':>7} | {'p95 first event (ms)':>20} | {'p95 cross-replica (ms)':>22} | "
        f"{'lost':>4} | {'failed':>6} | {'cores: replicas':>15} | {'PostgreSQL':>10} | {'bench':>5} | "
        f"{'commits/turn':>12}"
    )
    print(header)
    print("-" * len(header))
    for phase in phases:
        done = [t for t in phase.turns if t.last]
        delivery = [
            turn.watched[seq] - at
            for turn in phase.turns
            if turn.watch_from is not None
            for seq, at in turn.seen.items()
            if at > turn.watch_from and seq in turn.watched
        ]
        first = [t.first - t.posted for t in phase.turns if t.first is not None]
        ok = [t for t in done if t.last == "turn.completed"]
        failed = [t for t in done if t.last != "turn.completed" and not t.cut]  # cut: the kill's, below
        label = f"{phase.replicas}" + (" kill" if phase.killed_at is not None else "")
        print(
            f"{label:>8} | {len(ok) / phase.took:>7.1f} | {pct(first, 0.95) * 1000:>20.0f} | "
            f"{pct(delivery, 0.95) * 1000:>22.1f} | {sum(lost(t) for t in phase.turns):>4} | "
            f"{len(failed):>6} | {phase.cpu['replicas']:>15.2f} | {phase.cpu['PostgreSQL']:>10.2f} | "
            f"{phase.cpu['bench']:>5.2f} | "
            f"{phase.commits / max(1, len(done)):>12.1f}"
        )
    failures = {
        f"{t.last} {t.error}".strip() for p in phases for t in p.turns if t.last != "turn.completed" and not t.cut
    }
    for reason in sorted(failures):
        print(f"not completed: {reason or 'no terminal event'}")
    for phase in phases:
        if phase.killed_at is None:
            continue
        cut = [t for t in phase.turns if t.cut]
        interrupted = [t for t in cut if t.error == "interrupted"]
        others = [t for t in phase.turns if not t.cut and t.last and t.last != "turn.completed"]
        ends = [t.ended - phase.killed_at for t in interrupted if t.ended is not None]
        print(
            f"\nkill -9 of one of {phase.replicas} replicas at {args.seconds / 3:.0f} s: {len(cut)} turns cut, "
            f"{len(interrupted)} ended interrupted"
            + (f" (kill -> terminal event: median {statistics.median(ends):.1f} s, max {max(ends):.1f} s)"
               if ends else "")
            + f"; other turns not completed: {len(others)}; "
            f"its sessions' next turn started on another replica: {len(phase.retaken)}"
            + (f" (kill -> started: median {statistics.median(phase.retaken):.1f} s, max {max(phase.retaken):.1f} s)"
               if phase.retaken else "")
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each phase drives its sessions")
    parser.add_argument("--replicas", default="1,2,3", help="the phases, as replica counts")
    parser.add_argument("--lm-delay", type=float, default=1.0, help="seconds the scripted LM takes per answer")
    parser.add_argument("--watch-every", type=int, default=2, help="watch every n-th turn of a session elsewhere")
    parser.add_argument("--no-kill", dest="kill", action="store_false", help="leave out the kill -9 phase")
    parser.add_argument("--database-url", default=os.environ.get("FLEET_DATABASE_URL", ""))
    args = parser.parse_args()
    if not args.database_url.startswith("postgresql"):
        raise SystemExit("bench/scale.py needs PostgreSQL: set FLEET_DATABASE_URL=postgresql+asyncpg://user:pw@host/db")
    migrate.upgrade(args.database_url)
    home = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    config = home / "fleet.toml"
    # one sandbox per session, and a small pool per replica: the default cap (RAM / memory_mb) is for a
    # laptop, not 100 sessions at once
    config.write_text(f"[sandbox]\npool_size = 2\nmax_sandboxes = {4 * args.sessions + 16}\nidle_stop_s = 60\n")
    phases = []
    with LMProcess() as lm:
        env = {
            **os.environ, **lm.env(), "FLEET_HOME": str(home), "FLEET_CONFIG": str(config),
            "FLEET_DATABASE_URL": args.database_url, "FLEET_LM_MODEL": "openai/gpt-4o-mini",
        }  # fmt: skip
        env.pop("FLEET_SANDBOX", None)
        # a temp dir of their own: the machine-wide sandbox slots are these replicas' alone, not shared with
        # other Fleet processes of this user; the sandbox's user enters it to reach its files
        env["TMPDIR"] = tempfile.mkdtemp(prefix="fleet-scale-tmp-")
        os.chmod(env["TMPDIR"], 0o711)
        runs = [(int(n), False) for n in args.replicas.split(",")] + ([(3, True)] if args.kill else [])
        for count, kill in runs:
            replicas = Replicas(count, env)
            phase = Phase(count)
            try:
                time.sleep(3)  # pools fill
                args_for = argparse.Namespace(**{**vars(args), "kill": kill})
                asyncio.run(Driver(replicas, lm, phase, args_for).run())
            finally:
                replicas.close()
            phases.append(phase)
            print(f"  {count} replica(s){' with a kill' if kill else ''}: {len(phase.turns)} turns", flush=True)
    report(phases, args)


if __name__ == "__main__":
    main()
