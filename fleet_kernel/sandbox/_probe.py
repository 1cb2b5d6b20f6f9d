"""Whether the ``local`` sandbox can run on this machine, and if not, why and what to install or set.

``probe_bwrap`` starts one sandbox that does nothing; a pass is kept for the life of the process.
``cannot_run_here`` tells a machine where bubblewrap cannot run at all (the default backend then moves on)
from a fault of this machine's to fix.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from fleet_kernel.config import SandboxLimits
from fleet_kernel.sandbox import _confine
from fleet_kernel.sandbox._argv import bwrap_path, sandbox_argv

logger = logging.getLogger(__name__)


def _userns_hint() -> str:
    apparmor = "kernel.apparmor_restrict_unprivileged_userns"
    checks = {
        "/proc/sys/kernel/unprivileged_userns_clone": ("0", "sysctl -w kernel.unprivileged_userns_clone=1"),
        "/proc/sys/user/max_user_namespaces": ("0", "sysctl -w user.max_user_namespaces=15000"),
        "/proc/sys/" + apparmor.replace(".", "/"): (
            "1",
            f"install the bwrap AppArmor profile, or sysctl -w {apparmor}=0",
        ),
    }
    for path, (blocked, fix) in checks.items():
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == blocked:
                return f"unprivileged user namespaces are disabled: {fix}"
    return (
        "bubblewrap cannot create namespaces here (inside a container, run it with --privileged or a seccomp "
        "profile that allows unshare/clone of user namespaces)"
    )


# what probe_bwrap says when bubblewrap cannot run on this machine at all (not a fault to report)
CANNOT_RUN_HERE = (
    "bubblewrap needs Linux",
    "bubblewrap is not installed",
    "unprivileged user namespaces are disabled",
    "bubblewrap cannot create namespaces here",
)
_probe_lock = threading.Lock()
_probe_passed = False
_probe_failures: set[str] = set()  # reasons already logged


def probe_bwrap() -> str | None:
    """None when the ``local`` sandbox works here; else why not and what to install or set.

    One probe at a time (a kernel's warm-up and its first turn ask together), and only a pass is kept: a
    probe that timed out on a loaded machine is tried again by the next turn instead of moving every later
    turn to another backend.
    """
    global _probe_passed
    if _probe_passed:
        return None
    with _probe_lock:
        if not _probe_passed:
            reason = _probe_bwrap_once()
            if reason is not None:
                if reason not in _probe_failures:  # once per reason: a machine without it asks every turn
                    _probe_failures.add(reason)
                    logger.warning("the local sandbox cannot start here: %s", reason)
                return reason
            _probe_passed = True
    return None


def _probe_bwrap_once() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if bwrap_path() is None:
        return "bubblewrap is not installed: apt-get install bubblewrap (or dnf/pacman install bubblewrap)"
    seccomp = _confine.seccomp_fd()
    with tempfile.TemporaryDirectory(prefix="fleet-probe-") as workspace:
        command = [sys.executable, "-I", "-S", "-c", "pass"]
        argv = sandbox_argv(Path(workspace), SandboxLimits(), command, seccomp_fd=seccomp, join_fds=[])
        try:
            done = subprocess.run(  # noqa: S603 - the sandbox argv built here
                argv,
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
                pass_fds=() if seccomp is None else (seccomp,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap failed to run: {exc}"
        finally:
            if seccomp is not None:
                os.close(seccomp)
    if done.returncode == 0:
        return None
    error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
    if (unreachable := _temp_unreachable()) is not None:
        return f"{unreachable} (bwrap: {error})"
    if any(s in error for s in ("namespace", "uid map", "Operation not permitted", "setting up")):
        return f"{_userns_hint()} (bwrap: {error})"
    return f"bubblewrap cannot start the sandbox: {error}"


def _temp_unreachable() -> str | None:
    """Why the sandbox's own uid (root's sandboxes run as one) cannot reach the support folder; else None.

    The support folder is in the temp folder: a ``TMPDIR`` below a folder others may not enter (``/root``)
    stops every sandbox, whatever bubblewrap can do.
    """
    if os.geteuid() != 0:
        return None  # the sandbox's uid is this user's own, mapped: it enters what the user enters
    temp = Path(tempfile.gettempdir()).resolve()
    for folder in (*reversed(temp.parents), temp):
        with contextlib.suppress(OSError):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                return (
                    f"the sandbox's user cannot enter {folder} (mode {stat.filemode(mode)}), which holds the temp "
                    f"folder {temp} where Fleet keeps the sandbox's files: set TMPDIR to a folder every user may "
                    f"enter, such as /tmp, or `chmod o+x {folder}`"
                )
    return None


def cannot_run_here(reason: str) -> bool:
    """True when ``reason`` (from ``probe_bwrap``) means bubblewrap cannot run on this machine at all, so the
    default backend may be another one; any other failure is this machine's to fix, and is reported."""
    return reason.startswith(CANNOT_RUN_HERE)
