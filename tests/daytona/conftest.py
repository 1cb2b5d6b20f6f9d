"""Fixtures for the Daytona tests: the loopback fake server and the real SDK pointed at it.

Without the optional extra (``pip install 'fleet-kernel[daytona]'``, which also brings aiohttp) these
tests are not collected at all.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ["NO_PROXY"] = "127.0.0.1,localhost"  # httpx honours proxies; the fake is on loopback

if importlib.util.find_spec("daytona") is None or importlib.util.find_spec("aiohttp") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def fake() -> Iterator[Any]:
    from fake_sandbox import bwrap_usable
    from fake_server import FakeDaytona

    if not bwrap_usable():
        pytest.skip("the fake Daytona maps sandbox paths with bubblewrap, which cannot run here")
    with FakeDaytona(grace_s=1.0) as server:
        yield server


@pytest.fixture
def client(fake: Any) -> Any:
    from daytona import Daytona, DaytonaConfig

    return Daytona(DaytonaConfig(api_key=fake.api_key, api_url=fake.api_url))
