"""The workspace quota on the ``daytona`` backend: the local folder never grows past it when the sandbox's
files come back (the sandbox's own disk is Daytona's to bound)."""

from __future__ import annotations

import logging

import pytest

from fleet_kernel.config import Settings
from fleet_kernel.sandbox import daytona
from fleet_kernel.workspace import Workspace, usage

MB = 1024 * 1024


@pytest.fixture
def small(settings: Settings) -> Settings:
    sandbox = settings.policy.sandbox.model_copy(update={"workspace_mb": 5, "workspace_files": 200})
    return settings.model_copy(update={"policy": settings.policy.model_copy(update={"sandbox": sandbox})})


def test_files_over_the_quota_stay_in_the_sandbox_and_the_next_turn_works(
    small: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = Workspace.for_session(small.workspaces_dir, "quota")
    factory = daytona.open_daytona(small, workspace.root)
    factory().execute(
        "for n in range(8):\n"
        "    open(f'/workspace/artifacts/part{n}.bin', 'wb').write(b'x' * (1 << 20))\n"
        "import os\nos.makedirs('/workspace/artifacts/many')\n"
        "for n in range(300):\n    open(f'/workspace/artifacts/many/f{n}', 'w').close()"
    )
    with caplog.at_level(logging.WARNING, logger="fleet_kernel.sandbox._daytona_sync"):
        factory.close()
    size, entries = usage(workspace.root)
    assert size <= 5 * MB and entries <= 200
    assert (workspace.root / "artifacts" / "part0.bin").stat().st_size == MB
    assert "over its quota" in caplog.text

    factory = daytona.open_daytona(small, workspace.root)
    factory().execute(
        "import os\nfor n in range(8): os.remove(f'/workspace/artifacts/part{n}.bin')\n"
        "open('/workspace/artifacts/after.txt', 'w').write('fits')"
    )
    factory.close()
    assert (workspace.root / "artifacts" / "after.txt").read_text() == "fits"
    assert usage(workspace.root)[0] <= 5 * MB
