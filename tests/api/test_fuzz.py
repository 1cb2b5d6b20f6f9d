"""Property-based fuzzing of the committed OpenAPI document (schemathesis): no input gives a 5xx,
and every error keeps the contract's body. Bounded: a few examples per operation (FLEET_FUZZ_EXAMPLES, 8 by
default; more for a deeper run, e.g. ``FLEET_FUZZ_EXAMPLES=200 pytest tests/api/test_fuzz.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from live_api import LiveServer
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
schema = schemathesis.openapi.from_path(ROOT / "openapi.json")
EXAMPLES = int(os.environ.get("FLEET_FUZZ_EXAMPLES", "8"))


@pytest.fixture(scope="module")
def fuzz_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Hypothesis reads IPython's printer registry whenever IPython.lib.pretty is in sys.modules. LiteLLM imports
    # it, and a server thread that loads LiteLLM mid-case left it half-made for the test's thread (seen once).
    import IPython.lib.pretty  # noqa: F401

    home = tmp_path_factory.mktemp("fuzz-home")
    with ScriptedLM(default=step("Answer.", "SUBMIT(answer='ok')")) as lm:
        env = {"FLEET_HOME": str(home), **lm.env()}
        if os.environ.get("FLEET_TEST_DATABASE_URL"):
            env["FLEET_DATABASE_URL"] = os.environ["FLEET_TEST_DATABASE_URL"]
        with LiveServer(load_settings(env)) as live:
            yield live.url


def aim(case: schemathesis.Case, url: str) -> None:
    """Point every other case at a real, fresh session, so that cases reach past the 404s; keep evaluations
    to a few runs (each is a turn: what their bodies do is tested in the eval tests, not here)."""
    global _count
    if case.path == "/api/evals" and isinstance(case.body, dict):
        if isinstance(case.body.get("tasks"), list):
            case.body["tasks"] = case.body["tasks"][:2]
        if isinstance(case.body.get("repeat"), int) and case.body["repeat"] > 0:
            case.body["repeat"] = 1
        if isinstance(case.body.get("models"), list):
            case.body["models"] = case.body["models"][:2]
    _count += 1
    if _count % 2:
        return
    session_id = httpx.post(f"{url}/api/sessions", json={"title": "fuzz"}).json()["session_id"]
    if case.path_parameters and "session_id" in case.path_parameters:
        case.path_parameters["session_id"] = session_id
    if isinstance(case.query, dict) and "session_id" in case.query:
        case.query["session_id"] = session_id
    if isinstance(case.body, dict) and "session_id" in case.body:
        case.body["session_id"] = session_id


_count = 0


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)
def test_no_server_errors(case: schemathesis.Case, fuzz_url: str) -> None:
    aim(case, fuzz_url)
    response = case.call(base_url=fuzz_url, timeout=300)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    if "text/event-stream" not in str(response.headers.get("content-type")):
        assert "Traceback" not in response.text  # a turn's stream does carry the tracebacks of the model's code
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
