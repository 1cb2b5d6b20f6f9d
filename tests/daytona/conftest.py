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

from fleet_kernel.config import Settings, load_settings

sys.path.insert(0, str(Path(__file__).parent))
os.environ["NO_PROXY"] = "127.0.0.1,localhost"  # httpx honours proxies; the fake is on loopback

if importlib.util.find_spec("daytona") is None or importlib.util.find_spec("aiohttp") is None:
    collect_ignore_glob = ["test_*.py"]


LM_KEY = "sk-scripted-lm-secret"  # the suites check it never reaches the sandbox


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


@pytest.fixture
def env(fake: Any, fleet_env: dict[str, str]) -> dict[str, str]:
    """A Fleet environment on the Daytona backend, pointed at the fake."""
    return {
        **fleet_env,
        "FLEET_LM_API_KEY": LM_KEY,
        "FLEET_SANDBOX": "daytona",
        "FLEET_DAYTONA_API_KEY": fake.api_key,
        "FLEET_DAYTONA_API_URL": fake.api_url,
    }


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_kernel.sandbox import _daytona_box

    monkeypatch.setattr(_daytona_box, "BACKOFF_S", 0.01)


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    return load_settings(env)
