"""``[sandbox] max_sandboxes``: local sandboxes of every Fleet process of this user are capped machine-wide;
a turn past the cap is refused with 503 and a clear error, a turn after one ends runs. Real server, real
sandboxes, the real slot folder (in a temp dir of the test's own)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_api import LiveServer, assert_error, events_of, frames_until
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.sandbox import _slots, probe_bwrap

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")

ROOT = Path(__file__).resolve().parents[2]
HOLD = [step("Hold the sandbox.", "import time\nprint('holding', flush=True)\nwhile True:\n    time.sleep(0.05)")]
DONE = [step("Answer.", "print('ran')\nSUBMIT(answer='done')")]


@pytest.fixture
def slot_tmp(private_slots: Path) -> Path:
    """A temp dir of this test's own, so the machine-wide slot folder is this test's."""
    return private_slots


def capped(fleet_env: dict[str, str], tmp_path: Path, **sandbox: int) -> Settings:
    config = tmp_path / "fleet.toml"
    config.write_text("[sandbox]\n" + "".join(f"{key} = {value}\n" for key, value in sandbox.items()))
    return load_settings({**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": "local"})


@pytest.fixture
def client_for(fleet_env: dict[str, str], tmp_path: Path, slot_tmp: Path) -> Iterator[object]:
    servers: list[LiveServer] = []

    def build(**sandbox: int) -> httpx.Client:
        server = LiveServer(capped(fleet_env, tmp_path, **sandbox)).__enter__()
        servers.append(server)
        return httpx.Client(base_url=server.url, timeout=60)

    yield build
    for server in servers:
        server.__exit__(None, None, None)


def new_session(client: httpx.Client) -> str:
    response = client.post("/api/sessions", json={"title": "capped"})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def start(client: httpx.Client, session_id: str, task: str) -> httpx.Response:
    return client.post(f"/api/sessions/{session_id}/turns", json={"task": task}, headers={"Prefer": "respond-async"})


def wait_for_code(client: httpx.Client, session_id: str, turn_id: str) -> None:
    with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as response:
        assert frames_until(response, "output")[-1].event == "output"


def cancel_and_wait(client: httpx.Client, session_id: str, turn: dict[str, str]) -> None:
    assert client.put(f"/api/runs/{turn['run_id']}/cancellation").status_code == 202
    with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events") as response:
        assert events_of(response)[-1].event == "turn.cancelled"


def assert_refused(response: httpx.Response, cap: int) -> None:
    error = assert_error(response, 503, "sandbox_busy")
    assert f"the cap [sandbox] max_sandboxes is {cap}" in error["message"], error
    assert "sandboxes are running" in error["message"] and "raise it" in error["message"]
    assert int(response.headers["Retry-After"]) > 0


def finishes(client: httpx.Client, session_id: str, turn_id: str) -> str:
    with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as response:
        return events_of(response)[-1].event or ""


@pytest.mark.slow
def test_a_turn_past_the_cap_is_refused_and_one_after_a_turn_ends_runs(client_for, scripted_lm: ScriptedLM) -> None:
    client = client_for(max_sandboxes=1, pool_size=0)
    first, second = new_session(client), new_session(client)
    scripted_lm.add("hold it", HOLD)
    holding = start(client, first, "hold it")
    assert holding.status_code == 202, holding.text
    wait_for_code(client, first, holding.json()["turn_id"])

    assert_refused(start(client, second, "refused"), cap=1)
    assert client.get(f"/api/sessions/{second}/turns").json()["turns"] == []  # nothing was claimed

    cancel_and_wait(client, first, holding.json())
    scripted_lm.add("after the cancel", DONE)
    after = start(client, second, "after the cancel")
    assert after.status_code == 202, after.text
    assert finishes(client, second, after.json()["turn_id"]) == "turn.completed"


@pytest.mark.slow
def test_ready_sandboxes_in_the_pool_count_against_the_cap(client_for, scripted_lm: ScriptedLM) -> None:
    client = client_for(max_sandboxes=2, pool_size=2)
    sessions = [new_session(client) for _ in range(3)]
    turns = []
    for number, session_id in enumerate(sessions[:2]):
        scripted_lm.add(f"hold {number}", HOLD)
        response = start(client, session_id, f"hold {number}")
        assert response.status_code == 202, response.text
        wait_for_code(client, session_id, response.json()["turn_id"])
        turns.append(response.json())
    assert_refused(start(client, sessions[2], "a third"), cap=2)
    assert _slots.held(8) == 2  # two sandboxes in use, none ready beside them: the pool gave way
    cancel_and_wait(client, sessions[0], turns[0])
    scripted_lm.add("now there is room", DONE)
    after = start(client, sessions[2], "now there is room")
    assert after.status_code == 202, after.text
    assert finishes(client, sessions[2], after.json()["turn_id"]) == "turn.completed"
    cancel_and_wait(client, sessions[1], turns[1])


HOLDER = textwrap.dedent("""
    import sys
    from fleet_kernel.sandbox import _slots
    slot = _slots.acquire(1)
    print("held" if slot else "none", flush=True)
    sys.stdin.read()
""")


@pytest.mark.slow
def test_sandboxes_of_another_process_count_and_free_their_slot_when_it_dies(
    client_for, scripted_lm: ScriptedLM, slot_tmp: Path
) -> None:
    client = client_for(max_sandboxes=1, pool_size=0)
    session_id = new_session(client)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(slot_tmp)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert_refused(start(client, session_id, "refused"), cap=1)
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel drops its lock
        holder.wait()
    scripted_lm.add("after the other process", DONE)
    after = start(client, session_id, "after the other process")
    assert after.status_code == 202, after.text
    assert finishes(client, session_id, after.json()["turn_id"]) == "turn.completed"


@pytest.mark.skipif(os.getuid() != 0, reason="planting a folder of another user needs root")
def test_a_slot_folder_of_another_user_is_refused_not_used(client_for, slot_tmp: Path) -> None:
    client = client_for(max_sandboxes=4, pool_size=0)
    shared = slot_tmp / f"fleet-sandboxes-{os.getuid()}"
    shared.mkdir(mode=0o777, exist_ok=True)
    os.chown(shared, 65534, 65534)  # planted by another user, who could hold every slot in it
    error = assert_error(start(client, new_session(client), "anything"), 503, "sandbox_unavailable")
    assert str(shared) in error["message"] and "TMPDIR" in error["message"]
