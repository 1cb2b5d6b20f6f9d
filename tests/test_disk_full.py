"""The disk can fill and nothing is lost: the sandbox's copy-back onto a small real disk (an 8 MB tmpfs).

``_stage.copy_in`` / ``copy_out`` are the functions the stage runs around every local sandbox; here they
copy between real folders, and one test runs a real sandbox end to end.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import _stage, open_sandbox, probe_bwrap
from fleet_kernel.workspace import Workspace

LONG_NAMES = [("n" * (size - 4)) + ".txt" for size in (241, 248, 250, 255)]


def _hidden(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


def test_a_copy_back_onto_a_full_disk_leaves_no_partial_and_says_what_was_lost(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    stage, host = tmp_path / "stage", small_tmpfs / "workspace"
    (stage / "artifacts").mkdir(parents=True)
    (host / "artifacts").mkdir(parents=True)
    (stage / "artifacts" / "big.bin").write_bytes(os.urandom(12 << 20))
    (stage / "artifacts" / "small.txt").write_text("kept")

    lost = _stage.copy_out(str(stage), str(host), {})

    assert [(failure.path, failure.errno) for failure in lost] == [("artifacts/big.bin", errno.ENOSPC)]
    assert (host / "artifacts" / "small.txt").read_text() == "kept"
    assert not (host / "artifacts" / "big.bin").exists()
    assert _hidden(host) == []
    assert shutil.disk_usage(small_tmpfs).free > 6 << 20, "the failed copy still holds the disk"


def test_a_partial_left_by_a_crash_neither_blocks_the_name_nor_keeps_the_space(tmp_path: Path) -> None:
    stage, host = tmp_path / "stage", tmp_path / "host"
    stage.mkdir()
    host.mkdir()
    (host / ".data.csv.fleet-partial").write_bytes(b"half of an old copy")  # a copy-back killed midway
    (host / "notes.txt").write_text("old")

    snapshot = _stage.copy_in(str(host), str(stage), None)
    assert sorted(snapshot) == ["notes.txt"]  # Fleet's own leftovers never reach the sandbox
    assert _hidden(host) == []  # and no longer hold the disk
    (stage / "data.csv").write_text("a,b\n")
    assert _stage.copy_out(str(stage), str(host), snapshot) == []
    assert (host / "data.csv").read_text() == "a,b\n"


def test_names_up_to_255_bytes_are_copied_both_ways(tmp_path: Path) -> None:
    stage, host, again = tmp_path / "stage", tmp_path / "host", tmp_path / "again"
    for folder in (stage, host, again):
        folder.mkdir()
    for name in LONG_NAMES:
        (stage / name).write_text(name)

    assert _stage.copy_out(str(stage), str(host), {}) == []
    assert sorted(p.name for p in host.iterdir()) == sorted(LONG_NAMES)
    assert sorted(_stage.copy_in(str(host), str(again), None)) == sorted(LONG_NAMES)


@pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")
def test_a_sandbox_s_long_file_names_reach_the_host(tmp_path: Path) -> None:
    home = tmp_path / "home"
    policy = Policy(limits=Limits(exec_timeout_s=30), sandbox=SandboxLimits(pool_size=0))
    settings = Settings(
        home=home, database_url=f"sqlite+aiosqlite:///{home / 'fleet.db'}", sandbox="local", policy=policy
    )
    workspace = Workspace.for_session(settings.workspaces_dir, "ses-long-names")
    factory = open_sandbox(settings, workspace.root)
    try:
        interpreter = factory()
        interpreter.execute(f"for name in {LONG_NAMES!r}:\n    open('/workspace/artifacts/' + name, 'w').write(name)")
        interpreter.shutdown()
    finally:
        factory.close()
    saved = sorted(p.name for p in (workspace.root / "artifacts").iterdir())
    assert saved == sorted(LONG_NAMES)
