"""Fixtures for the Daytona tests: the loopback fake server and the real SDK pointed at it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ["NO_PROXY"] = "127.0.0.1,localhost"  # httpx honours proxies; the fake is on loopback

from fake_sandbox import bwrap_usable  # noqa: E402
from fake_server import FakeDaytona  # noqa: E402

pytest.importorskip("daytona", reason="the Daytona SDK is an optional extra: pip install 'fleet-kernel[daytona]'")


@pytest.fixture
def fake() -> Iterator[FakeDaytona]:
    if not bwrap_usable():
        pytest.skip("the fake Daytona maps sandbox paths with bubblewrap, which cannot run here")
    with FakeDaytona(grace_s=1.0) as server:
        yield server


@pytest.fixture
def client(fake: FakeDaytona):  # type: ignore[no-untyped-def]
    from daytona import Daytona, DaytonaConfig

    return Daytona(DaytonaConfig(api_key=fake.api_key, api_url=fake.api_url))
