"""The temp folder: support folders of killed Fleet processes are swept at start; a TMPDIR the sandbox's
user cannot reach is reported as the cause, and the default backend never moves to Pyodide because of it
(it moves only where bubblewrap cannot run at all, and then says so)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_kernel.sandbox import _probe

NOBODY = 65534
SUPPORT_PREFIX = "fleet-sandbox-"
MAKE_SUPPORT = "from fleet_kernel.sandbox import _support; print(_support.support_dir(), flush=True)"


def _python(code: str, tmpdir: Path, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **kwargs
    )


def _support_folders(tmpdir: Path) -> set[str]:
    return {p.name for p in tmpdir.iterdir() if p.name.startswith(SUPPORT_PREFIX)}


def test_support_folders_of_killed_processes_are_swept_at_start(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    for _ in range(3):  # a server or kernel killed: its atexit never runs
        killed = _python(f"{MAKE_SUPPORT}\nimport os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmpdir)
        killed.communicate(timeout=120)
        assert killed.returncode == -signal.SIGKILL
    assert _support_folders(tmpdir)  # the last one's folder is left behind
    alive = _python(f"{MAKE_SUPPORT}\nimport sys; sys.stdin.read()", tmpdir)  # a live process keeps its own
    try:
        assert alive.stdout is not None
        kept = Path(alive.stdout.readline().strip()).name
        assert _support_folders(tmpdir) == {kept}
        starting = _python(MAKE_SUPPORT, tmpdir)
        out, _ = starting.communicate(timeout=120)
        assert _support_folders(tmpdir) == {kept}  # the new one is removed at its own exit
        assert Path(out.strip()).name != kept
    finally:
        alive.communicate("", timeout=120)
    assert _support_folders(tmpdir) == set()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user")
def test_another_users_support_folder_is_left_alone(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    theirs = tmpdir / f"{SUPPORT_PREFIX}999999999-abcdefgh"  # no such process
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    starting = _python(MAKE_SUPPORT, tmpdir)
    starting.communicate(timeout=120)
    assert theirs.is_dir()


# ---------------------------------------------------------------------- the backend fallback


def _doctor_sandbox(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "fleet_api", "doctor", "sandbox"],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _unreachable_tmpdir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("only root's sandboxes run as a uid of their own, which a 0700 folder keeps out")
    if _probe.probe_bwrap() is not None:
        pytest.skip(f"the local sandbox cannot run here: {_probe.probe_bwrap()}")
    private = tmp_path / "private"
    (private / "tmp").mkdir(parents=True)
    private.chmod(0o700)
    return private / "tmp"


@pytest.mark.slow
@pytest.mark.parametrize("chosen", ["", "local"])
def test_a_tmpdir_the_sandbox_cannot_reach_is_the_reported_cause(
    chosen: str, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    """Without FLEET_SANDBOX the default stays local (bubblewrap is here), so both say why local fails."""
    tmpdir = _unreachable_tmpdir(tmp_path)
    done = _doctor_sandbox({**fleet_env, "TMPDIR": str(tmpdir), "FLEET_SANDBOX": chosen}, tmp_path)
    assert done.returncode == 1, done.stdout
    line = next(line for line in done.stdout.splitlines() if "sandbox" in line and "FLEET_HOME" not in line)
    assert "TMPDIR" in line and "cannot enter" in line, line
    assert "pyodide" not in line.lower() and "deno" not in line.lower(), line


@pytest.mark.slow
def test_the_default_says_why_local_was_not_used(fleet_env: dict[str, str], tmp_path: Path) -> None:
    """Where bubblewrap is not installed the default may be pyodide, and says why local is not used."""
    bin_dir = tmp_path / "bin"  # a PATH without bwrap
    bin_dir.mkdir()
    for tool in ("deno", "node"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    done = _doctor_sandbox({**fleet_env, "PATH": str(bin_dir)}, tmp_path)
    line = next(line for line in done.stdout.splitlines() if "pyodide" in line)
    assert "the local sandbox is not used: bubblewrap is not installed" in line, done.stdout
