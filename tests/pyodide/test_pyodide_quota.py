"""The workspace quota on the ``pyodide`` backend: in Pyodide's filesystem and where changes reach the host."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox.pyodide import open_pyodide, probe_pyodide
from fleet_kernel.workspace import Workspace

if (_missing := probe_pyodide()) is not None:
    pytest.skip(f"pyodide sandbox unavailable: {_missing}", allow_module_level=True)


def make_settings(home: Path) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=30), sandbox=SandboxLimits(workspace_mb=5, workspace_files=200))
    return Settings(home=home, database_url="sqlite://", sandbox="pyodide", policy=policy)


OVER_BYTES = textwrap.dedent("""
    import errno
    try:
        with open('/workspace/artifacts/big.bin', 'wb') as handle:
            for _ in range(8):
                handle.write(b'x' * (1 << 20))
        print('wrote 8 MB')
    except OSError as exc:
        print('bytes', errno.errorcode[exc.errno])
""")
OVER_FILES = textwrap.dedent("""
    import errno
    made = 0
    try:
        for n in range(1000):
            open(f'/workspace/artifacts/f{n}', 'w').close()
            made += 1
        print('made 1000 files')
    except OSError as exc:
        print('files', errno.errorcode[exc.errno], made < 200)
""")


@pytest.mark.slow
def test_quota_is_an_oserror_in_pyodide_and_the_session_goes_on(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home")
    workspace = Workspace.for_session(settings.workspaces_dir, "quota").root
    factory = open_pyodide(settings, workspace)
    try:
        interp = factory()
        assert interp.execute(OVER_BYTES) == "bytes ENOSPC"
        interp.execute("import os; os.remove('/workspace/artifacts/big.bin')")
        assert interp.execute(OVER_FILES) == "files ENOSPC True"
        interp.execute("import os\nfor n in os.listdir('/workspace/artifacts'): os.remove('/workspace/artifacts/' + n)")
        assert interp.execute("open('/workspace/artifacts/ok.txt', 'w').write('fine')") == "4"
    finally:
        factory.close()
    assert (workspace / "artifacts" / "ok.txt").read_text() == "fine"
    assert [p.name for p in (workspace / "artifacts").iterdir()] == ["ok.txt"]


@pytest.mark.slow
def test_host_refuses_write_backs_over_the_quota(tmp_path: Path) -> None:
    """What the runner reports is checked again on the host: write-backs from a runner that no longer
    enforces the quota (code reaching around it through the ``js`` module) cannot fill the disk."""
    settings = make_settings(tmp_path / "home")
    workspace = Workspace.for_session(settings.workspaces_dir, "forged").root
    factory = open_pyodide(settings, workspace)
    try:
        interp = factory()
        interp.start()
        session = interp._session  # the host's end of the protocol, as the runner's messages reach it
        chunk = base64.b64encode(b"x" * (3 << 20)).decode()
        for n in range(3):
            session._write_back({"type": "workspace_file", "path": f"artifacts/part{n}.bin", "data": chunk})
        for n in range(300):
            session._write_back({"type": "workspace_file", "path": f"artifacts/many/f{n}", "data": ""})
    finally:
        factory.close()
    saved = sorted(p.name for p in (workspace / "artifacts").iterdir())
    assert saved[:1] == ["many"] and "part0.bin" in saved and "part1.bin" not in saved
    assert len(list((workspace / "artifacts" / "many").iterdir())) < 200


@pytest.mark.slow
def test_a_write_back_onto_a_full_disk_leaves_no_partial_and_is_reported(small_tmpfs: Path) -> None:
    """A change the host has no room for is removed whole and noted for the turn, which fails naming the disk."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from disk_fill import fill_disk

    from fleet_kernel.workspace import take_unsaved

    settings = make_settings(small_tmpfs / "home")
    workspace = Workspace.for_session(settings.workspaces_dir, "full").root
    factory = open_pyodide(settings, workspace)
    try:
        interp = factory()
        fill_disk(small_tmpfs / "filler")
        interp.execute("open('/workspace/artifacts/lost.txt', 'w').write('x' * 100_000)")
        interp.execute("print('after')")  # the write-back of the change above has been applied (or not) by now
    finally:
        factory.close()
    unsaved = take_unsaved(workspace)
    assert unsaved is not None and unsaved.disk_full
    assert "is full" in unsaved.error(workspace)["message"]
    assert not (workspace / "artifacts" / "lost.txt").exists()
    assert sorted(p.name for p in (workspace / "artifacts").iterdir()) == []  # no partial holds the disk
