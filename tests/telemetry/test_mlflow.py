"""Fleet's traces in a real MLflow server (from PyPI, SQLite backend, loopback), read back with MLflow's client.

Turns run through the API and through a kernel, with only the two variables docs/observability.md shows.
If MLflow cannot be installed or started here, the test says so and is skipped; test_traces.py still checks
what Fleet sends with its own OTLP receiver.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kernel_harness import Kernel
from live_api import LiveServer, run_turn
from ports import free_port
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings

# Found, not imported: importing mlflow takes ~1.5 s, which every test worker would pay at collection.
if importlib.util.find_spec("mlflow") is None:
    pytest.skip("mlflow is not installed (pip install 'fleet-kernel[dev]')", allow_module_level=True)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a loopback port with a SQLite backend store; its URL."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
               "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]  # fmt: skip
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MLFLOW_ENABLE_WORKSPACES": "false"}
    log = (root / "server.log").open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"mlflow server could not start here: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        _warm_up(url)
        yield url
    finally:
        ingest = [
            line for line in (root / "server.log").read_text().splitlines() if "/v1/traces" in line or "rror" in line
        ]
        print("\n".join(ingest[-50:]))  # shown when the test fails
        os.killpg(process.pid, signal.SIGTERM)  # the CLI and its uvicorn and job workers: the CLI alone took 10 s
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        log.close()
        shutil.rmtree(root / "artifacts", ignore_errors=True)


def _warm_up(url: str) -> None:
    """The server's first OTLP request loads its tracing stack (slow on a busy machine): do it before turns."""
    from mlflow import MlflowClient
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    experiment_id = MlflowClient(url).create_experiment("warm-up")
    now = time.time_ns()
    span = {"trace_id": os.urandom(16), "span_id": os.urandom(8), "name": "warm-up",
            "start_time_unix_nano": now, "end_time_unix_nano": now + 1000}  # fmt: skip
    body = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [span]}]}]).SerializeToString()
    headers = {"content-type": "application/x-protobuf", "x-mlflow-experiment-id": experiment_id}
    response = httpx.post(f"{url}/v1/traces", content=body, headers=headers, timeout=170)
    assert response.status_code == 200, response.text


def _otel_env(url: str, experiment_id: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces",  # the two variables of docs/observability.md
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-mlflow-experiment-id={experiment_id}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "60",  # the server's first ingestion loads a lot on a busy machine
    }


def _traces(client: Any, experiment_id: str, count: int, chats: int = 0) -> list[Any]:
    """The experiment's traces once ``count`` of them are whole: the root span, ``chats`` LM spans, and
    MLflow's token totals caught up with those spans (span batches can be ingested after the root's)."""
    deadline = time.monotonic() + 300
    while True:
        traces = client.search_traces(locations=[experiment_id])
        complete = [t for t in traces if any(s.parent_id is None for s in t.data.spans) and _ingested(t, chats)]
        if len(complete) >= count or time.monotonic() > deadline:
            return complete
        time.sleep(0.5)


def _ingested(trace: Any, chats: int) -> bool:
    spans = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
    tokens = sum(int(s.attributes.get("gen_ai.usage.input_tokens") or 0) for s in spans)
    return len(spans) >= chats and (trace.info.token_usage or {}).get("input_tokens") == tokens


def _check_tree(trace: Any, events: list[dict[str, Any]]) -> None:
    spans = trace.data.spans
    root = _root(trace)
    assert root.name == "fleet.turn" and root.span_type == "AGENT"
    assert root.attributes["fleet.turn_id"] == events[0]["turn_id"]
    iterations = [s for s in spans if s.parent_id == root.span_id]
    assert [s.name for s in iterations] == ["fleet.iteration"] * 2
    chats = [s for s in spans if s.span_type == "CHAT_MODEL"]
    lm = [e["data"] for e in events if e["type"] == "lm.finished"]
    assert len(chats) == len(lm) and {c.parent_id for c in chats if c.attributes["fleet.lm.role"] == "root"} <= {
        s.span_id for s in iterations
    }
    (tool,) = [s for s in spans if s.span_type == "TOOL"]
    assert tool.name == "execute_tool llm_query"
    assert any(c.parent_id == tool.span_id for c in chats)
    usage = events[-1]["data"]["usage"]
    tokens = trace.info.token_usage
    assert tokens["input_tokens"] == usage["prompt_tokens"] > 0
    assert tokens["output_tokens"] == usage["completion_tokens"]


@pytest.mark.slow
@pytest.mark.alone  # beside the parallel workers' load, the API turn's trace sometimes never reached MLflow
@pytest.mark.timeout(900)  # a real MLflow server on a shared machine: slow to start and to ingest the first trace
def test_turns_from_the_api_and_a_kernel_land_in_mlflow(
    mlflow_server: str, fleet_env: dict[str, str], scripted_lm: ScriptedLM, kernelspec: Path,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    experiment_id = client.create_experiment(f"fleet-{tmp_path.name}")
    otel = _otel_env(mlflow_server, experiment_id)
    for name, value in otel.items():
        monkeypatch.setenv(name, value)  # the SDK reads its variables from the process environment
    script = [step("Ask.", "print(llm_query('what is 6*7?'))"), step("Done.", "SUBMIT(answer='42')")]
    scripted_lm.add("from the api", list(script))
    scripted_lm.add("from the kernel", list(script))

    settings = load_settings({**fleet_env, **otel})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        session_id = http.post("/api/sessions", json={"title": "mlflow"}).json()["session_id"]
        api_events = [f.envelope for f in run_turn(http, session_id, "from the api")]
    assert api_events[-1]["type"] == "turn.completed"

    kernel = Kernel({**fleet_env, **otel})
    try:
        run = kernel.run("from the kernel")
        assert run.reply["content"]["status"] == "ok", run.text()
        assert "LM calls (root 2, sub 1)" in kernel.run("%fleet usage").text()
        traces = _traces(client, experiment_id, 2, chats=3)  # before the kernel stops: it waits 5 s at most for MLflow
    finally:
        kernel.close()

    by_turn = {_root(t).attributes["fleet.turn_id"]: t for t in traces}
    assert len(by_turn) == 2, [
        (t.info, [(s.name, s.parent_id) for s in t.data.spans]) for t in client.search_traces(locations=[experiment_id])
    ]
    api_turn = api_events[0]["turn_id"]
    _check_tree(by_turn.pop(api_turn), api_events)
    ((kernel_turn, kernel_trace),) = by_turn.items()
    _check_tree(kernel_trace, stored_events(settings, kernel_turn))


def _root(trace: Any) -> Any:
    return next(s for s in trace.data.spans if s.parent_id is None)


def stored_events(settings: Any, turn_id: str) -> list[dict[str, Any]]:
    """The stored events of a turn, as envelopes."""
    import asyncio

    from fleet_kernel.store import Store

    async def read() -> list[dict[str, Any]]:
        store = await Store.open(settings.database_url)
        try:
            return [e.model_dump() for e in await store.events_after(turn_id)]
        finally:
            await store.close()

    return asyncio.run(read())
