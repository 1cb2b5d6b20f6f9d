"""The ``local`` sandbox: a CPython worker running ``runtime.py`` under bubblewrap; and ``unsafe-local``.

``local`` (the default on Linux): no network, no host files but the Python install (read-only), a
fresh ``/tmp``, a quota-limited copy of the session workspace at ``/workspace`` (``_stage.py`` mounts it
and copies changes back), uid 65534 without capabilities (mapped to the host user, or to a uid of its
own when the host is root), a seccomp filter, rlimits and, where the hierarchy is writable, a cgroup
for memory and process count.
``unsafe-local`` runs the same runtime as a plain subprocess of the host user: explicit opt-in only.
This module starts and stops those processes (``ProcessSession``); their command line is ``_argv.py``'s,
the files bound into them ``_support.py``'s, and whether bubblewrap runs here at all ``_probe.py``'s. The
backend objects that turns use, over this and the pool (``pool.py``), are ``local_backend.py``'s.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Literal

from fleet_kernel.config import SandboxLimits
from fleet_kernel.sandbox import _confine, _slots
from fleet_kernel.sandbox._argv import sandbox_argv, tuning_env
from fleet_kernel.sandbox._protocol import PipeSession, SessionClosed
from fleet_kernel.sandbox._support import SANDBOX_RUNTIME, support_dir
from fleet_kernel.workspace import Unsaved, note_unsaved

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0  # for the copy-back of a stopped sandbox's workspace
START_TIMEOUT_S = 10.0
SLOT_WAIT_S = 30.0  # a sandbox a turn starts beyond its reserved one (a child RLM's) waits this long for a slot
_LIVE: weakref.WeakSet[ProcessSession] = weakref.WeakSet()  # killed at exit, so no cgroup outlives us


def _kernel_counts_nproc_per_userns() -> bool:
    """Since Linux 5.14 RLIMIT_NPROC set inside a user namespace counts only that namespace's processes."""
    with contextlib.suppress(ValueError):
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
        return (major, minor) >= (5, 14)
    return False


def busy_message(cap: int) -> str:
    """What a user reads when the machine runs as many sandboxes as the cap allows."""
    return (
        f"{_slots.held(cap)} sandboxes are running, the cap [sandbox] max_sandboxes is {cap}; "
        "wait for a turn to end or raise it in fleet.toml"
    )


class SlotsFull(SessionClosed):
    """No slot freed under ``[sandbox] max_sandboxes`` in time; the message says so."""


class ProcessSession(PipeSession):
    """One CPython worker (under bubblewrap unless ``isolated`` is false) running the runtime.

    Started without a workspace (isolated only), it waits, ready, until ``adopt`` names one (the pool).
    Each holds a slot under ``[sandbox] max_sandboxes`` (``_slots``) from its start until it is reaped:
    its turn's reserved one when free, else a free one, waited for up to ``slot_wait_s``.
    """

    start_timeout_s = START_TIMEOUT_S
    slot_wait_s = SLOT_WAIT_S

    def __init__(self, workspace: Path | None, limits: SandboxLimits, *, isolated: bool) -> None:
        super().__init__()
        self._workspace, self._limits, self._isolated = workspace, limits, isolated
        self._adopt: socket.socket | None = None  # our end of the stage's adopt socket, until adopted
        self._saved: int | None = None  # the stage says "saved" here once the workspace is copied back
        self._stopping = False  # kill() has begun: no longer alive, whatever is left to reap
        self._slot: _slots.Slot | None = None

    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    def alive(self) -> bool:
        return not self._stopping and self._process is not None and self._process.poll() is None

    def healthy(self) -> bool:
        """Alive, and its channel neither ended nor holds a message nobody asked for (a waiting sandbox says
        nothing): the runtime killed inside a live stage shows as the end of its stdout (see ``_stage.py``)."""
        if not self.alive() or self._eof or self._buffer:
            return False
        poller = select.poll()
        poller.register(self._stdout_fd, select.POLLIN)
        return not poller.poll(0)

    def adopt(self, workspace: Path) -> None:
        """Bind this pre-started sandbox to ``workspace``: its files are copied in before this returns."""
        channel = self._adopt
        if channel is None or self._workspace is not None:
            raise SessionClosed("is not waiting for a workspace")
        try:
            channel.settimeout(STOP_TIMEOUT_S)  # a copy-in of a large workspace
            channel.sendall(str(workspace.absolute()).encode() + b"\n")
            answer = channel.makefile("rb").readline().decode(errors="replace").strip()
        except OSError as exc:
            answer = f"error {exc}"
        if answer != "ok":
            self.kill()
            raise SessionClosed(f"could not take the workspace: {answer or 'the sandbox exited'}")
        self._workspace, self._adopt = workspace, None
        channel.close()
        reserved = _slots.claim(str(workspace.absolute()))
        if reserved is not None:  # run on the turn's slot; the pool's own frees, for its refill
            own, self._slot = self._slot, reserved
            if own is not None:
                own.release()

    def _take_slot(self) -> _slots.Slot:
        """The turn's reserved slot, else a free one (waiting up to ``slot_wait_s``, or until killed)."""
        cap = self._limits.sandbox_cap
        key = str(self._workspace.absolute()) if self._workspace is not None else None
        slot = _slots.claim(key) if key is not None else None
        slot = slot or _slots.acquire(cap, wait_s=self.slot_wait_s, stop=lambda: self._stopping)
        if self._stopping:
            if slot is not None:
                slot.release()
            raise SessionClosed("was stopped before it started")
        if slot is None:
            raise SlotsFull(busy_message(cap))
        return slot

    def start(self, *, wait: bool = True) -> None:
        """Start the sandbox and (``wait``) wait until it is ready; else call ``wait_ready`` later."""
        limits = self._limits
        self._slot = self._slot or self._take_slot()
        options = ["--max-output-bytes", str(limits.max_output_bytes)]
        self._cgroup = _confine.Cgroup.create(limits.memory_mb, limits.max_processes + 16, limits.cpu_cores)
        join_fds = self._cgroup.join_fds() if self._cgroup else []
        seccomp = _confine.seccomp_fd() if self._isolated else None
        rlimits = _confine.rlimits(limits.memory_mb, limits.cpu_seconds, limits.max_file_mb)
        if self._isolated:
            options += ["--reap", "1"]
            if _kernel_counts_nproc_per_userns():
                options += ["--nproc", str(limits.max_processes)]
            command = [sys.executable, "-I", "-B", SANDBOX_RUNTIME, *options]
            stage_end = None
            if self._workspace is None:
                self._adopt, stage_end = socket.socketpair()
                join_fds.append(stage_end.detach())  # passed on and closed here like the cgroup fds
            self._saved, saved_end = os.pipe()
            argv = sandbox_argv(
                self._workspace,
                limits,
                command,
                seccomp_fd=seccomp,
                join_fds=join_fds[:-1] if stage_end is not None else join_fds,
                adopt_fd=join_fds[-1] if stage_end is not None else None,
                saved_fd=saved_end,
                rlimits=rlimits,
            )
            join_fds.append(saved_end)  # passed on and closed here like the cgroup fds
            env, cwd, preexec = {}, None, None  # _stage.py sets the rlimits, and joins the cgroup after its copy
        else:
            prefix, preexec = _confine.child_start(join_fds, rlimits)
            argv = [*prefix, sys.executable, "-I", "-B", str(support_dir() / "runtime.pyc"), *options]
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self._workspace),
                "LANG": "C.UTF-8",
                **tuning_env(),
            }
            cwd = str(self._workspace)
        passed = [*([] if seccomp is None else [seccomp]), *(join_fds if preexec is None else [])]
        try:
            process = subprocess.Popen(  # noqa: S603 - the sandbox argv built here
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                bufsize=1 << 16,
                pass_fds=passed,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            self.kill()
            raise SessionClosed(f"could not be started: {exc}") from exc
        finally:
            for fd in [*join_fds, *([] if seccomp is None else [seccomp])]:
                os.close(fd)
        _LIVE.add(self)
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError, AttributeError):  # fewer round trips for big messages
                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)  # type: ignore[union-attr]
        self._attach(process, wait=False)
        if self._stopping:  # killed while it started (a cancelled turn): the kill may have missed the process
            self.kill()
            raise SessionClosed("was stopped while it started")
        if wait:
            self.wait_ready()

    def kill(self) -> None:
        """Stop the sandbox; ``_stage.py`` then copies the workspace back, which this waits for.

        The stage's exit after that (the teardown of its mount namespace, ~3 ms) and the cleanup here
        (reaping, the cgroup) run on a thread, off the turn's path.
        """
        self._stopping = True
        waiting = self._adopt is not None  # never adopted (or adopting now): nothing to save, no copy-back to wait for
        if self._adopt is not None:
            with contextlib.suppress(OSError):
                self._adopt.shutdown(socket.SHUT_RDWR)  # wakes an ``adopt`` blocked on the stage's answer
            self._adopt.close()
            self._adopt = None
        process, saved, self._saved = self._process, self._saved, None
        try:
            if process is not None and self._isolated and not waiting:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    process.send_signal(signal.SIGTERM)
                said = _said_saved(saved, STOP_TIMEOUT_S) if saved is not None else None
                if said is not None:
                    if isinstance(said, Unsaved) and self._workspace is not None:
                        note_unsaved(self._workspace, said)
                    threading.Thread(target=self._reap, name="fleet-sandbox-stop", daemon=True).start()
                    return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=STOP_TIMEOUT_S)
            self._reap()
        finally:
            if saved is not None:
                os.close(saved)

    def _reap(self) -> None:
        """End what is left of the process and its cgroup, then free its slot."""
        super().kill()
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def _explain_death(self) -> str:
        limits = self._limits
        code = self._exit_code()
        number = -code if code is not None and code < 0 else code - 128 if code and code > 128 else 0
        if self._cgroup is not None and self._cgroup.oom_killed():
            reason = f"was killed because it ran out of memory (limit {limits.memory_mb} MB)"
        elif number == signal.SIGXCPU:
            reason = f"was stopped because it used up its CPU time ({limits.cpu_seconds} s)"
        elif number == signal.SIGKILL:
            reason = "was killed (SIGKILL; out of memory?)"
        elif number == signal.SIGSEGV:
            reason = "crashed with a segmentation fault (SIGSEGV)"
        elif number in set(signal.Signals):
            reason = f"was killed by {signal.Signals(number).name}"
        else:
            reason = f"exited unexpectedly (status {code})"
        stderr = self._stderr_tail.decode("utf-8", "replace").strip()  # bwrap errors, Python's fatal errors
        if "Fatal Python error" in stderr:
            reason += ":\n" + "\n".join(stderr[stderr.index("Fatal Python error") :].splitlines()[:12])
        elif stderr:
            reason += ":\n" + "\n".join(stderr.splitlines()[-5:])
        return reason


def _said_saved(fd: int, timeout: float) -> Unsaved | Literal[True] | None:
    """What the stage said on ``fd`` within ``timeout``: True (all saved), what it could not save
    (``_stage.saved_line``), or None when it exited without a word.

    ``poll``, not ``select``: a server's descriptors can number above select's 1024.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    line = os.read(fd, 1 << 16) if poller.poll(timeout * 1000) else b""
    if line.startswith(b"saved"):
        return True
    if not line.startswith(b"unsaved "):
        return None
    try:
        report = json.loads(line[len(b"unsaved ") :])
        files = [(str(path), int(number), str(reason)) for path, number, reason in report["files"]]
        return Unsaved(int(report["count"]), files)
    except (ValueError, KeyError, TypeError):
        return Unsaved(1, [(".", 0, "the sandbox's copy-back sent a report that could not be read")])


@atexit.register
def _kill_live_sessions() -> None:
    for session in list(_LIVE):
        session.kill()
