"""The inside of one fake Daytona sandbox: a folder tree, volume mounts, REPL contexts and commands.

Each sandbox is a temporary folder standing in for its root filesystem; volumes are folders mounted
at their ``mount_path`` (with ``subpath``). Processes (context workers, ``process/execute``) run
under bubblewrap so sandbox paths such as ``/workspace`` and ``/tmp`` are real inside them. The fake
is not an isolation boundary: the host is bound read-only, nothing else is hidden. Without a usable
bubblewrap, processes run as plain subprocesses and absolute sandbox paths are not mapped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet_kernel.sandbox._support import python_paths

WORKER = Path(__file__).with_name("fake_worker.py")
HOME = "/home/daytona"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINE_LIMIT = 1024 * 1024  # the daemon's bufio.Scanner cap on one worker line
SEND_QUEUE = 256  # the daemon's per-client frame queue; a full queue closes the socket with 1008
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TIMEOUT = 1000, 1001, 1008, 4008
_OVERRIDDEN = {"proc", "dev", "tmp", "home", "sys", "run", "workspace"}


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@functools.cache
def bwrap_usable() -> bool:
    """Whether bubblewrap can run a process here (needs unprivileged user namespaces or root)."""
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def sandbox_python() -> str:
    return shutil.which("python3", path=SANDBOX_PATH) or sys.executable


@dataclass
class Mount:
    path: str  # where the sandbox sees it
    source: Path  # the host folder behind it


@dataclass
class FakeSandbox:
    id: str
    name: str
    root: Path
    env: dict[str, str]
    labels: dict[str, str]
    mounts: list[Mount]
    volumes: list[dict[str, Any]]
    auto_stop_interval: int = 15
    auto_archive_interval: int = 10080
    auto_delete_interval: int = -1
    state: str = "started"
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    contexts: dict[str, Context] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sub in ("home/daytona", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.mounts.sort(key=lambda m: len(m.path))

    # -- paths ----------------------------------------------------------------------------------

    def host_path(self, path: str, cwd: str = HOME) -> Path:
        """The host file behind a sandbox path (relative paths start at ``cwd``)."""
        absolute = os.path.normpath(os.path.join(cwd, path))
        for mount in reversed(self.mounts):  # the longest mount path wins
            if absolute == mount.path or absolute.startswith(mount.path.rstrip("/") + "/"):
                rest = absolute[len(mount.path) :].lstrip("/")
                return mount.source / rest
        return self.root / absolute.lstrip("/")

    def process_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What a process in the sandbox sees: the sandbox's own variables, never the host's."""
        return {"PATH": SANDBOX_PATH, "HOME": HOME, "LANG": "C.UTF-8", **self.env, **(extra or {})}

    def command(self, argv: list[str], cwd: str) -> tuple[list[str], str | None]:
        """``argv`` wrapped so sandbox paths resolve; returns the host argv and host cwd (if unwrapped)."""
        if not bwrap_usable():
            return argv, str(self.host_path(cwd))
        args = ["bwrap", "--die-with-parent", "--dev", "/dev", "--proc", "/proc"]
        for entry in sorted(os.listdir("/")):
            if entry in _OVERRIDDEN:
                continue
            if os.path.islink(f"/{entry}"):
                args += ["--symlink", os.readlink(f"/{entry}"), f"/{entry}"]
            elif os.path.isdir(f"/{entry}"):
                args += ["--ro-bind", f"/{entry}", f"/{entry}"]
        for entry in sorted(os.listdir(self.root)):
            if (self.root / entry).is_dir() and (entry in _OVERRIDDEN or not os.path.lexists(f"/{entry}")):
                args += ["--bind", str(self.root / entry), f"/{entry}"]
        for mount in self.mounts:
            mount.source.mkdir(parents=True, exist_ok=True)
            args += ["--bind", str(mount.source), mount.path]
        for prefix in [*python_paths(), str(WORKER.parent)]:  # the host's Python and the worker script,
            args += ["--ro-bind", prefix, prefix]  # even where they live under an overridden /tmp
        (self.host_path(cwd)).mkdir(parents=True, exist_ok=True)
        return [*args, "--chdir", cwd, *argv], None

    # -- lifecycle ------------------------------------------------------------------------------

    async def create_context(self, cwd: str | None) -> Context:
        context = Context(self, uuid.uuid4().hex if cwd != "default" else "default", cwd or HOME)
        await context.start()
        self.contexts[context.id] = context
        return context

    async def default_context(self) -> Context:
        context = self.contexts.get("default")
        if context is None:
            context = Context(self, "default", HOME)
            await context.start()
            self.contexts["default"] = context
        return context

    async def stop_processes(self) -> None:
        contexts, self.contexts = list(self.contexts.values()), {}
        await asyncio.gather(*(c.shutdown() for c in contexts))

    async def run_command(
        self, command: str, cwd: str | None, envs: dict[str, str] | None, timeout: int | None
    ) -> tuple[int, str] | None:
        """``process/execute``: split like the daemon (quotes, no escapes); ``None`` on timeout."""
        argv, host_cwd = self.command(split_command(command), cwd or HOME)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=host_cwd,
            env=self.process_env(envs),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout if timeout and timeout > 0 else None)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return None
        return proc.returncode or 0, out.decode("utf-8", "replace")


def split_command(command: str) -> list[str]:
    """The daemon's command splitting: spaces separate, single or double quotes group, no escapes."""
    args, current, quote = [], [], ""
    for ch in command:
        if ch in "'\"" and (not quote or quote == ch):
            quote = "" if quote else ch
        elif ch == " " and not quote:
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        args.append("".join(current))
    return args


Send = Callable[[str], Awaitable[None]]


class Execution:
    """One client attached to a context while its code runs: a bounded frame queue, like the daemon's."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[str | tuple[int, str]] = asyncio.Queue(SEND_QUEUE + 1)
        self.done = asyncio.Event()
        self.control = ""
        self.slow = False

    def offer(self, frame: str) -> None:
        if self.slow:
            return
        if self.frames.qsize() >= SEND_QUEUE:
            self.slow = True
            self.frames.put_nowait((CLOSE_POLICY, "slow consumer"))
            return
        self.frames.put_nowait(frame)


class Context:
    """A persistent Python worker; executions run FIFO, output is streamed to the attached client."""

    def __init__(self, sandbox: FakeSandbox, context_id: str, cwd: str) -> None:
        self.sandbox, self.id, self.cwd = sandbox, context_id, cwd
        self.created_at = now()
        self.active = False
        self.grace_s = 2.0
        self._proc: asyncio.subprocess.Process | None = None
        self._worker_pid: int | None = None  # the Python process itself (bwrap's child)
        self._hello = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._client: Execution | None = None
        self._fifo = asyncio.Lock()

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cwd": self.cwd,
            "language": "python",
            "active": self.active,
            "createdAt": self.created_at,
        }

    @property
    def pid(self) -> int | None:
        return self._worker_pid

    async def start(self) -> None:
        argv, host_cwd = self.sandbox.command([sandbox_python(), "-u", str(WORKER)], self.cwd)
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=host_cwd,
            env=self.sandbox.process_env(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
            limit=LINE_LIMIT,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        await asyncio.wait_for(self._hello.wait(), 30)
        self.active = True

    async def _read_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            while True:
                line = await self._proc.stdout.readline()
                if not line:
                    break
                try:
                    chunk = json.loads(line)
                except ValueError:
                    continue  # the daemon logs and drops lines that are not JSON
                if chunk.get("type") == "hello":
                    self._worker_pid = int(chunk["pid"])
                    self._hello.set()
                    continue
                client = self._client
                if client is None:
                    continue  # no one attached: the daemon drops the output
                if chunk.get("type") == "control":
                    client.control = str(chunk.get("text", ""))
                    client.done.set()
                client.offer(json.dumps({k: chunk.get(k, "") for k in ("type", "text", "name", "value", "traceback")}))
        except (ValueError, asyncio.LimitOverrunError):
            return  # a line over 1 MiB stops the daemon's read loop; executions then time out
        await self._proc.wait()
        self.active = False
        client = self._client
        if client is not None:
            client.control = "died"
            client.done.set()

    async def execute(
        self,
        code: str,
        envs: dict[str, str] | None,
        timeout: float,
        send: Send,
        close: Callable[[int, str], Awaitable[None]],
    ) -> None:
        """Run ``code`` after earlier executions; stream frames through ``send`` and close like the daemon."""
        async with self._fifo:
            client = Execution()
            writer = asyncio.get_running_loop().create_task(self._write(client, send, close))
            self._client = client
            code_close = (CLOSE_NORMAL, "")
            try:
                if not self.active or self._proc is None or self._proc.stdin is None:
                    code_close = (CLOSE_GOING_AWAY, "worker process ended")
                else:
                    self._proc.stdin.write((json.dumps({"code": code, "envs": envs or {}}) + "\n").encode())
                    await self._proc.stdin.drain()
                    code_close = await self._wait(client, timeout)
            finally:
                self._client = None
                client.frames.put_nowait(code_close)
                await writer

    async def _wait(self, client: Execution, timeout: float) -> tuple[int, str]:
        try:
            await asyncio.wait_for(client.done.wait(), timeout if timeout > 0 else None)
        except TimeoutError:
            self.signal(signal.SIGINT)
            try:
                await asyncio.wait_for(client.done.wait(), self.grace_s)
            except TimeoutError:
                await self.kill()
                return CLOSE_TIMEOUT, ""
        if client.control == "interrupted":
            return CLOSE_TIMEOUT, ""
        if client.control == "died":
            return CLOSE_GOING_AWAY, "worker process ended"
        return CLOSE_NORMAL, ""

    @staticmethod
    async def _write(client: Execution, send: Send, close: Callable[[int, str], Awaitable[None]]) -> None:
        while True:
            frame = await client.frames.get()
            if isinstance(frame, tuple):
                await close(*frame)
                return
            try:
                await send(frame)
            except (ConnectionError, RuntimeError):
                pass  # the client left; the code keeps running, as on the daemon

    def signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.returncode is None and self._worker_pid is not None:
            try:
                os.kill(self._worker_pid, signum)
            except ProcessLookupError:
                pass

    async def kill(self) -> None:
        self.active = False
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()

    async def shutdown(self) -> None:
        """SIGTERM, then SIGKILL after the grace period, as the daemon deletes a context."""
        self.signal(signal.SIGTERM)
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), self.grace_s)
            except TimeoutError:
                await self.kill()
        self.active = False
        if self._reader is not None:
            self._reader.cancel()
