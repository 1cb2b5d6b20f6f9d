"""The ``pyodide`` backend: ``runtime.py`` in Pyodide (CPython on WebAssembly) under Deno.

The portable fallback where bubblewrap cannot run (macOS, containers without user namespaces): the
boundary is WebAssembly plus Deno's permissions (read-only access to the runner, the Pyodide cache and
the session workspace; no network, environment, subprocesses or writes). Deno comes from the ``deno``
PyPI wheel; Pyodide from the npm registry, fetched once by ``ensure_pyodide()`` (``python -m
fleet_kernel.sandbox.pyodide``) into a ``DENO_DIR`` cache; at run time Deno runs ``--cached-only``, so it
never fetches anything. ``pyodide_runner.js`` speaks the same protocol as the local worker, so
``SandboxInterpreter`` drives it unchanged; this module adds the process, the cache and the
write-back of the workspace files the code changed (Deno itself may not write).
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet_kernel import safe_files
from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import SandboxLimits, Settings
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox._protocol import MAX_MESSAGE_BYTES, PipeSession, SessionClosed
from fleet_kernel.sandbox.contract import describe
from fleet_kernel.sandbox.factory import SandboxFactory
from fleet_kernel.sandbox.runtime import MessageType
from fleet_kernel.workspace import ARTIFACTS_DIR, FULL_ERRNOS, MEMORY_DIR, Unsaved, Workspace, note_unsaved, usage

logger = logging.getLogger(__name__)

PYODIDE_VERSION = "0.29.4"  # also pinned in pyodide_runner.js
PYODIDE_PYTHON = "3.13"
PYODIDE_SPEC = f"npm:pyodide@{PYODIDE_VERSION}/pyodide.js"
PREFETCH_COMMAND = "python -m fleet_kernel.sandbox.pyodide"
RUNNER = Path(__file__).with_name("pyodide_runner.js")
RUNTIME = Path(__file__).with_name("runtime.py")
START_TIMEOUT_S = 60.0  # a cold start is ~3 s on an idle machine, several times that on a loaded one
DENO_BASELINE_MB = 384  # Deno + V8 + Pyodide before any user data; added to the memory limit
WRITABLE = (f"{ARTIFACTS_DIR}/", f"{MEMORY_DIR}/")  # what sandboxed code may change in the host workspace
_DENO_FLAGS = ("--no-config", "--no-lock", "--node-modules-dir=false")
MAX_DENIED_LINKS = 5000  # symbolic links in one workspace, each denied on Deno's command line


# -- Deno and the Pyodide cache -------------------------------------------------------------------


def find_deno() -> str | None:
    """The Deno binary: the ``deno`` wheel's, else one on PATH."""
    try:
        from deno import find_deno_bin  # noqa: PLC0415 - the optional pyodide extra

        return str(find_deno_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("deno")


def default_cache_dir() -> Path:
    """Where ``ensure_pyodide()`` puts the cache by default: per user, shared by every FLEET_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fleet" / "deno"


def cache_candidates(home: Path | None = None) -> list[Path]:
    """Caches looked for, in order: ``$FLEET_HOME/deno``, the user cache, one shipped inside the package."""
    return [*([home / "deno"] if home else []), default_cache_dir(), Path(__file__).with_name("_deno")]


def _cached(deno_dir: Path) -> bool:
    package = deno_dir / "npm" / "registry.npmjs.org" / "pyodide" / PYODIDE_VERSION
    return (package / "pyodide.asm.wasm").is_file() and (package / "python_stdlib.zip").is_file()


def find_cache(home: Path | None = None) -> Path | None:
    return next((path for path in cache_candidates(home) if _cached(path)), None)


def snapshot_path(deno_dir: Path) -> Path:
    """Pyodide's memory after start-up, made by ``ensure_pyodide()``: starts take ~0.6 s instead of ~3 s."""
    return deno_dir / "fleet" / f"pyodide-{PYODIDE_VERSION}.snapshot"


def _deno_env(deno_dir: Path, *, fetch: bool = False) -> dict[str, str]:
    """Deno's environment: minimal at run time (no secret can leak in); the whole one to fetch (proxies, CAs)."""
    env = {"DENO_DIR": str(deno_dir), "DENO_NO_PACKAGE_JSON": "1", "DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    if fetch:
        return {**os.environ, **env}
    for name in ("PATH", "SYSTEMROOT"):  # Windows needs SYSTEMROOT
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def ensure_pyodide(deno_dir: Path | None = None, *, timeout: float = 600) -> Path:
    """Fetch Pyodide from the npm registry into ``deno_dir`` unless it is there; returns the cache used.

    For setup scripts, ``fleet doctor`` and CI; needs the network once, never at run time.

    Raises:
        SandboxUnavailableError: Deno is missing or the fetch failed (the message has Deno's error).
    """
    target = (deno_dir or default_cache_dir()).absolute()
    deno = find_deno()
    if deno is None:
        raise SandboxUnavailableError("Deno is not installed: pip install 'fleet-kernel[pyodide]' (the deno wheel)")
    if _cached(target):
        if not _usable_snapshot(target):
            _make_snapshot(deno, target, timeout)
        return target
    target.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(  # noqa: S603 - deno's fixed argv
            [deno, "cache", *_DENO_FLAGS, PYODIDE_SPEC],
            env=_deno_env(target, fetch=True),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailableError(f"Could not fetch Pyodide {PYODIDE_VERSION}: {exc}") from exc
    if done.returncode != 0 or not _cached(target):
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise SandboxUnavailableError(
            f"Could not fetch Pyodide {PYODIDE_VERSION} from the npm registry into "
            f"{target}: {' '.join(detail) or f'deno exited with {done.returncode}'}"
        )
    _make_snapshot(deno, target, timeout)
    return target


def _usable_snapshot(deno_dir: Path) -> bool:
    """Whether the snapshot looks like one (Pyodide's magic bytes); the runner falls back if it still fails."""
    try:
        with snapshot_path(deno_dir).open("rb") as handle:
            return handle.read(4) == b"\x00snp"
    except OSError:
        return False


def _make_snapshot(deno: str, deno_dir: Path, timeout: float) -> None:
    """Start Pyodide once and save its memory (the one Deno run allowed to write, into the cache only)."""
    path = snapshot_path(deno_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        deno,
        "run",
        "--cached-only",
        "--no-prompt",
        *_DENO_FLAGS,
        f"--allow-read={os.path.realpath(RUNNER)},{os.path.realpath(deno_dir)}",
        f"--allow-write={os.path.realpath(path.parent)}",
        os.path.realpath(RUNNER),
        json.dumps({"make_snapshot": os.path.realpath(path)}),
    ]
    try:
        done = subprocess.run(  # noqa: S603 - deno's fixed argv
            argv, env=_deno_env(deno_dir), capture_output=True, text=True, timeout=timeout, check=False
        )
        failure = None if done.returncode == 0 and path.is_file() else done.stderr.strip()[-500:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure is not None:  # the sandbox still works, it only starts slower
        logger.warning("could not make the Pyodide start-up snapshot: %s", failure)


def probe_pyodide(home: Path | None = None) -> str | None:
    """None when the pyodide sandbox can start here; else what is missing and the command that fixes it."""
    if find_deno() is None:
        return "Deno is not installed: pip install 'fleet-kernel[pyodide]' (or pip install 'deno>=2,<3')"
    if find_cache(home) is None:
        return (
            f"Pyodide {PYODIDE_VERSION} is not cached for offline use: run `{PREFETCH_COMMAND}` once (it "
            f"fetches {PYODIDE_SPEC} from the npm registry into {default_cache_dir()})"
        )
    return None


# -- one runner process ---------------------------------------------------------------------------


class PyodideSession(PipeSession):
    """One Deno process running ``pyodide_runner.js``: protocol messages as JSON lines on stdin/stdout."""

    start_timeout_s = START_TIMEOUT_S

    def __init__(self, deno: str, deno_dir: Path, workspace: Path, limits: SandboxLimits) -> None:
        super().__init__()
        self._deno, self._deno_dir, self._limits = deno, deno_dir, limits
        self._workspace = Workspace(workspace)
        self._usage: tuple[int, int] | None = None  # bytes and entries in the workspace, once counted
        # Files written by code come back base64-encoded in one message.
        self.message_limit = max(MAX_MESSAGE_BYTES, limits.max_file_mb * 1024 * 1024 * 4 // 3 + 1024 * 1024)

    def argv(self) -> list[str]:
        """The Deno command line: read-only access to exactly what the runner needs, nothing else."""
        readable = [RUNNER, RUNTIME, self._deno_dir, self._workspace.root]
        config = {
            "runtime": os.path.realpath(RUNTIME),
            "workspace": os.path.realpath(self._workspace.root),
            "max_output_bytes": self._limits.max_output_bytes,
            "max_file_bytes": self._limits.max_file_mb * 1024 * 1024,
            "workspace_bytes": self._limits.workspace_mb * 1024 * 1024,
            "workspace_files": self._limits.workspace_files,
        }
        if _usable_snapshot(self._deno_dir):
            config["snapshot"] = os.path.realpath(snapshot_path(self._deno_dir))
        # Deno matches permissions against real paths (denoland/deno#9607).
        allow = ",".join(os.path.realpath(path) for path in readable)
        deny = [f"--deny-read={path}" for path in _symlinks_to_deny(self._workspace.root)]
        return [
            self._deno,
            "run",
            "--cached-only",
            "--no-prompt",
            *_DENO_FLAGS,
            f"--allow-read={allow}",
            *deny,
            os.path.realpath(RUNNER),
            json.dumps(config),
        ]

    def start(self) -> None:
        join_fds, prefix, preexec = self._confinement()
        try:
            process = subprocess.Popen(  # noqa: S603 - deno's fixed argv
                [*prefix, *self.argv()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_deno_env(self._deno_dir),
                cwd=self._workspace.root,
                pass_fds=join_fds,
                start_new_session=True,
                preexec_fn=preexec,  # only without prlimit (see _confine.launcher)
            )  # noqa: PLW1509 - only writes to fds and sets rlimits, no locks
        except OSError as exc:
            self.kill()
            raise SessionClosed(f"could not be started: {exc}") from exc
        finally:
            for fd in join_fds:
                os.close(fd)
        self._attach(process)

    def _confinement(self) -> tuple[list[int], list[str], Any]:
        """On Linux: a cgroup for memory (when writable) and CPU/file-size rlimits; never RLIMIT_AS (V8 needs it)."""
        if not sys.platform.startswith("linux"):
            return [], [], None
        # Linux only (setrlimit, seccomp): elsewhere Deno runs with its own permissions alone
        import resource  # noqa: PLC0415 - Linux only, as below

        from fleet_kernel.sandbox import _confine  # noqa: PLC0415 - pyseccomp and cgroups only on Linux, when a worker starts

        limits = self._limits
        self._cgroup = _confine.Cgroup.create(limits.memory_mb + DENO_BASELINE_MB, 256)
        rlimits = [
            (which, value)
            for which, value in _confine.rlimits(limits.memory_mb, limits.cpu_seconds, limits.max_file_mb)
            if which != resource.RLIMIT_AS
        ]
        join_fds = self._cgroup.join_fds() if self._cgroup else []
        return join_fds, *_confine.child_start(join_fds, rlimits)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next protocol message; workspace write-backs are applied here, before the ``done`` they precede."""
        while True:
            item = super().receive(timeout)
            if item is not None and item.get("type") in (MessageType.WORKSPACE_FILE, MessageType.WORKSPACE_DELETE):
                self._write_back(item)
                continue
            return item

    def _write_back(self, message: dict[str, Any]) -> None:
        """Apply one change the code made under artifacts/ or memory/; anything else is refused and logged."""
        relative = str(message.get("path") or "")
        try:
            if not relative.startswith(WRITABLE):
                raise ValueError(f"{relative!r} is not under {' or '.join(WRITABLE)}")
            target = self._workspace.resolve(relative)
            if message["type"] == MessageType.WORKSPACE_DELETE:
                if target.is_file():
                    target.unlink()
                    self._usage = None
                return
            data = base64.b64decode(str(message.get("data") or ""), validate=True)
            if len(data) > self._limits.max_file_mb * 1024 * 1024:
                raise ValueError(f"{relative!r} is larger than {self._limits.max_file_mb} MB")
            self._within_quota(target, len(data))
            safe_files.write_path(self._workspace.root, relative, data)  # whole or not at all, no link followed
        except (OSError, ValueError) as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
            if isinstance(cause, OSError) and cause.errno in FULL_ERRNOS:  # the turn fails naming the disk
                note_unsaved(self._workspace.root, Unsaved(1, [(relative, cause.errno, cause.strerror or str(cause))]))
            else:
                logger.warning("pyodide sandbox: workspace change not applied: %s", exc)

    def _within_quota(self, target: Path, size: int) -> None:
        """The host's own check of ``[sandbox] workspace_mb`` / ``workspace_files`` (code can reach around
        the runner's filesystem check through the ``js`` module, never around this one)."""
        if self._usage is None:
            self._usage = usage(self._workspace.root)
        used_bytes, used_entries = self._usage
        old = target.stat().st_size if target.is_file() and not target.is_symlink() else None
        new_entries = sum(1 for parent in target.parents if not parent.exists()) + (old is None)
        used_bytes, used_entries = used_bytes + size - (old or 0), used_entries + new_entries
        limits = self._limits
        if used_bytes > limits.workspace_mb * 1024 * 1024 or used_entries > limits.workspace_files:
            raise ValueError(
                f"saving {target.name} would take the workspace over its quota "
                f"({limits.workspace_mb} MB, {limits.workspace_files} files)"
            )
        self._usage = (used_bytes, used_entries)

    def _explain_death(self) -> str:
        """Why Deno ended, in words the model can act on."""
        code = self._exit_code()
        stderr = self._stderr_tail.decode("utf-8", "replace")
        if self._cgroup is not None and self._cgroup.oom_killed():
            reason = f"was killed because it ran out of memory (limit {self._limits.memory_mb} MB)"
        elif "out of memory" in stderr.lower() or "RangeError: Array buffer allocation" in stderr:
            reason = "ran out of memory (WebAssembly memory is limited to 4 GB)"
        elif code is not None and code < 0:
            reason = f"was killed by {signal.Signals(-code).name}" if -code in set(signal.Signals) else "was killed"
        else:
            reason = f"exited unexpectedly (status {code})"
        lines = [line for line in stderr.splitlines() if line.strip() and not line.lstrip().startswith("at ")][-6:]
        if lines:
            reason += ":\n" + "\n".join(lines)
        return reason


def _symlinks_to_deny(workspace: Path) -> list[str]:
    """Every symbolic link in the workspace, as paths for ``--deny-read``.

    Deno checks a path where the link is, not where it points, so a link that exists when Deno starts
    (planted by code of another backend in the same session, say) would read any host file through
    the workspace's read permission. Pyodide code cannot make links itself (no write permission). A
    link whose path has a comma (Deno's list separator, with no escape) is denied by its closest
    ancestor without one.

    Raises:
        SessionClosed: a link sits at the top of the workspace under a name with a comma, or there are
            too many links to list.
    """
    root = os.path.realpath(workspace)
    denied: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):  # never follows links
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            parts = list(itertools.takewhile(lambda part: "," not in part, Path(path).relative_to(root).parts))
            if not parts:
                raise SessionClosed(f"remove the symbolic link {path!r} from the workspace (Deno cannot deny it)")
            denied.add(os.path.join(root, *parts))
            if len(denied) > MAX_DENIED_LINKS:
                raise SessionClosed(
                    f"the workspace {root} holds more than {MAX_DENIED_LINKS} symbolic links; remove them"
                )
    return sorted(denied)


# -- the factory ----------------------------------------------------------------------------------


def execution_instructions(exec_timeout_s: float) -> str:
    """The prompt's description of this environment (what works in Pyodide, what does not)."""
    return describe(
        f"Python {PYODIDE_PYTHON} (Pyodide {PYODIDE_VERSION}, CPython compiled to WebAssembly) runs in a "
        "sandbox with no network access",
        exec_timeout_s=exec_timeout_s,
        notes="Only the standard library is available and nothing can be installed; threads and "
        "subprocesses do not work.",
    )


def open_pyodide(
    settings: Settings, workspace: Path, *, cancel: CancelToken | None = None, deno_dir: Path | None = None
) -> SandboxFactory:
    """An interpreter factory whose interpreters each run in their own Pyodide worker process.

    Raises:
        SandboxUnavailableError: Deno or the Pyodide cache is missing; the message names the fix.
    """
    deno = find_deno()
    cache = deno_dir if deno_dir is not None and _cached(deno_dir) else find_cache(settings.home)
    if deno is None or cache is None:
        raise SandboxUnavailableError(f"The pyodide sandbox cannot run: {probe_pyodide(settings.home)}")
    workspace = Workspace(workspace.absolute()).ensure().root
    limits, exec_timeout_s = settings.policy.sandbox, settings.limits.exec_timeout_s

    def new_session() -> PyodideSession:
        return PyodideSession(deno, cache, workspace, limits)

    return SandboxFactory(
        new_session,
        backend="pyodide",
        execution_instructions=execution_instructions(exec_timeout_s),
        exec_timeout_s=exec_timeout_s,
        cancel=cancel,
        max_output_bytes=limits.max_output_bytes,
    )


class PyodideBackend:
    """``pyodide``: the portable fallback; needs Deno and the Pyodide cache (``PREFETCH_COMMAND``)."""

    def status(self, settings: Settings) -> str | None:
        return probe_pyodide(settings.home)

    def instructions(self, settings: Settings, workspace: Path) -> str:  # noqa: ARG002 - the backend contract's signature
        return execution_instructions(settings.limits.exec_timeout_s)

    def open(self, settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
        return open_pyodide(settings, workspace, cancel=cancel)

    def forget(self, settings: Settings, session_id: str) -> None:
        """Nothing outlives a turn: each interpreter is its own Deno process."""


BACKEND = PyodideBackend()


def main() -> None:
    """``python -m fleet_kernel.sandbox.pyodide [DENO_DIR]``: prefetch Pyodide for offline use."""
    try:
        path = ensure_pyodide(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    except SandboxUnavailableError as exc:
        sys.exit(f"error: {exc.message}")
    snapshot = "with" if _usable_snapshot(path) else "without"
    print(f"Pyodide {PYODIDE_VERSION} is cached in {path} ({snapshot} a start-up snapshot)")


if __name__ == "__main__":
    main()
