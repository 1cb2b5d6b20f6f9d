"""Two processes, one store: a second API started with `fleet serve` runs turns that this one watches,
cancels and de-duplicates, as it would for a turn running in a notebook kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from live_api import LiveServer, assert_error, events_of, frames_until
from ports import free_port
from scripted_lm import ScriptedLM, step

from fleet_kernel.kernel.sidecar import spawn_sidecar

FOREVER = [step("Wait.", "import time\nwhile True:\n    time.sleep(0.05)")]
DONE = [step("Answer.", "SUBMIT(answer='once')")]


# A second process on the store: a fresh server and store of the test's own (on the shared one, the second
# process was seen not to find sessions the first had just made, after other tests had used that store).
pytestmark = pytest.mark.own_server


@pytest.fixture
def other(fleet_env: dict[str, str], live: LiveServer) -> Iterator[httpx.Client]:
    """A second API process (`fleet serve`) on the same store, home and LM."""
    port = free_port()
    process = spawn_sidecar(port, env=fleet_env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client
    finally:
        process.terminate()
        process.wait(20)


def start_async(client: httpx.Client, session_id: str, task: str, key: str | None = None) -> httpx.Response:
    headers = {"Prefer": "respond-async", **({"Idempotency-Key": key} if key else {})}
    return client.post(f"/api/sessions/{session_id}/turns", json={"task": task}, headers=headers)


@pytest.mark.slow
def test_watch_and_cancel_a_turn_running_elsewhere(
    client: httpx.Client, other: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("runs in the other process", FOREVER)
    running = start_async(other, session_id, "runs in the other process").json()
    url = f"/api/sessions/{session_id}/turns/{running['turn_id']}/events"
    with client.stream("GET", url) as r:  # tailed from the store: the turn does not run here
        seen = frames_until(r, "code")
    assert seen[0].event == "turn.started"

    error = assert_error(start_async(client, session_id, "another task"), 409, "session_busy")
    assert error["turn_id"] == running["turn_id"]

    asked = time.monotonic()
    assert client.put(f"/api/runs/{running['run_id']}/cancellation").json()["state"] == "requested"
    with client.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
        rest = events_of(r)
    took = time.monotonic() - asked
    assert rest[-1].event == "turn.cancelled", rest[-1].data
    assert took < 30, f"the other process took {took:.2f} s to honour the cancellation"  # liveness: the code never ends
    frames = seen + rest
    assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1))
    assert other.get(f"/api/sessions/{session_id}/turns/{running['turn_id']}").json()["status"] == "cancelled"


@pytest.mark.slow
def test_one_key_two_processes_one_run(
    client: httpx.Client, other: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("raced across processes", [{"delay": 0.3, **DONE[0]}])
    barrier = threading.Barrier(6)
    answers: list[httpx.Response] = []

    def post(base: str) -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            barrier.wait()
            answers.append(start_async(c, session_id, "raced across processes", "cross-key"))

    threads = [threading.Thread(target=post, args=(str(c.base_url),)) for c in (client, other) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in answers] == [202] * 6, [r.text for r in answers]
    assert len({r.json()["turn_id"] for r in answers}) == 1 and sum(r.json()["created"] for r in answers) == 1
    turn_id = answers[0].json()["turn_id"]
    with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as r:
        frames = events_of(r)
    assert [f.event for f in frames].count("turn.started") == 1 and frames[-1].event == "turn.completed"


@pytest.mark.slow
def test_serve_refuses_open_bind_without_token(fleet_env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_api", "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        env={**os.environ, **fleet_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "FLEET_API_TOKEN" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_serve_without_a_store_fails_in_one_line(fleet_env: dict[str, str]) -> None:
    env = {**os.environ, **fleet_env, "FLEET_DATABASE_URL": "postgresql+asyncpg://fleet:pw@127.0.0.1:1/fleet"}
    result = subprocess.run(
        [sys.executable, "-m", "fleet_api", "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "database" in result.stderr and "Traceback" not in result.stderr and "pw@" not in result.stderr


RUNNER = """
import asyncio, sys
from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.store import Store

async def main():
    settings = load_settings()
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    handle = await runner.start(sys.argv[1], sys.argv[2])
    print(handle.turn_id, handle.run_id, flush=True)
    print((await handle.wait()).status, flush=True)
    await runner.close()
    await store.close()

asyncio.run(main())
"""


@pytest.mark.slow
def test_watch_and_cancel_a_turn_in_a_kernel_like_process(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, fleet_env: dict[str, str]
) -> None:
    """A bare TurnRunner in its own process, as a notebook kernel runs turns: the API watches and cancels it."""
    scripted_lm.add("runs in a kernel", FOREVER)
    kernel = subprocess.Popen(
        [sys.executable, "-c", RUNNER, session_id, "runs in a kernel"],
        env={**os.environ, **fleet_env},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert kernel.stdout is not None
        turn_id, run_id = kernel.stdout.readline().split()
        url = f"/api/sessions/{session_id}/turns/{turn_id}/events"
        with client.stream("GET", url) as r:
            seen = frames_until(r, "code")
        assert client.put(f"/api/runs/{run_id}/cancellation").json()["state"] == "requested"
        with client.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
            rest = events_of(r)
        assert rest[-1].event == "turn.cancelled"
        assert kernel.stdout.readline().strip() == "cancelled"
        assert kernel.wait(30) == 0
    finally:
        if kernel.poll() is None:
            kernel.kill()
