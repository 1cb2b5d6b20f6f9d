"""``fleet serve --workers 2``: two processes on one port and one store, each running the turns it accepted.

A worker killed with SIGKILL mid-turn loses only its own turns (they end ``interrupted``, and their watchers
are told), the other worker's turns go on and can be cancelled from any connection, uvicorn's supervisor starts
a replacement, and the killed turn's session takes a new turn.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from live_api import events_of
from ports import free_port
from scripted_lm import ScriptedLM, step

from fleet_kernel.kernel.sidecar import spawn_sidecar
from fleet_kernel.store import Store

SLOW = {"delay": 60, **step("Think slowly.", "SUBMIT(answer='too late')")}
DONE = step("Answer.", "SUBMIT(answer='done')")
BOUND_S = 30.0  # how long the test waits for what must happen (generous: a liveness bound, not a timing)

pytestmark = [pytest.mark.slow, pytest.mark.own_server]


def two_workers(supervisor: psutil.Process, without: int = 0) -> set[int] | None:
    """The supervisor's two worker processes (uvicorn starts them with multiprocessing's spawn), none of them
    ``without``; None until then."""
    pids = set()
    for child in supervisor.children():
        with contextlib.suppress(psutil.Error):  # a killed worker is a zombie until the supervisor reaps it
            if "spawn_main" in " ".join(child.cmdline()):
                pids.add(child.pid)
    return pids if len(pids) == 2 and without not in pids else None


def new_connection(base: str) -> httpx.Client:
    """A client on a connection of its own: whichever worker accepts it serves its requests."""
    return httpx.Client(base_url=base, timeout=60, headers={"Connection": "close"})


def until(check, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + BOUND_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {BOUND_S:g} s: {what}"
        time.sleep(0.1)
    return result


async def test_a_killed_worker_loses_only_its_own_turns(
    fleet_env: dict[str, str], scripted_lm: ScriptedLM, store: Store
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = spawn_sidecar(port, env=fleet_env, workers=2, wait_s=60)
    try:
        supervisor = psutil.Process(process.pid)
        first_workers = until(lambda: two_workers(supervisor), "two workers run")
        log = Path(fleet_env["FLEET_HOME"]) / "logs" / f"api-{port}.log"
        until(lambda: log.read_text().count("Application startup complete.") == 2, "both workers serve")

        async def slow_turn(task: str) -> tuple[int, dict[str, str]]:
            """A slow turn in a session of its own, started on a new connection: (its worker's pid, the turn)."""
            scripted_lm.add(task, [SLOW])
            with new_connection(base) as c:
                session_id = c.post("/api/sessions", json={}).json()["session_id"]
                response = c.post(
                    f"/api/sessions/{session_id}/turns", json={"task": task}, headers={"Prefer": "respond-async"}
                )
            assert response.status_code == 202, response.text
            turn = {**response.json(), "session_id": session_id}
            owner = int((await store.get_turn(turn["turn_id"])).owner.split(":")[1])
            assert owner in first_workers, f"{task} is owned by {owner}, not a worker of {first_workers}"
            return owner, turn

        # which worker accepts a connection is the kernel's choice (often the same one while both are idle):
        # the second turn is started while the first one's worker is stopped, so the other accepts it (both serve
        # by now: a worker still starting would keep the first stopped past the supervisor's 5 s health check)
        doomed, first = await slow_turn("slow 1")
        os.kill(doomed, signal.SIGSTOP)
        try:
            survivor, second = await slow_turn("slow 2")
        finally:
            os.kill(doomed, signal.SIGCONT)
        assert survivor != doomed
        turns = {doomed: [first], survivor: [second]}

        os.kill(doomed, signal.SIGKILL)
        with new_connection(base) as c:
            for turn in turns[doomed]:
                url = f"/api/sessions/{turn['session_id']}/turns/{turn['turn_id']}"
                until(lambda url=url: c.get(url).json()["status"] == "interrupted", "the killed worker's turn ends")
                with c.stream("GET", f"{url}/events") as r:
                    frames = events_of(r)
                assert frames[-1].event == "turn.failed", [f.event for f in frames]
                assert frames[-1].envelope["data"]["error"]["type"] == "interrupted"
            for turn in turns[survivor]:
                url = f"/api/sessions/{turn['session_id']}/turns/{turn['turn_id']}"
                assert c.get(url).json()["status"] == "running", "the other worker's turn was touched"

        replaced = until(lambda: two_workers(supervisor, without=doomed), "the supervisor replaces the killed worker")
        assert survivor in replaced

        # the killed turn's session takes a new turn, which completes
        scripted_lm.add("the next turn", [DONE])
        session_id = turns[doomed][0]["session_id"]
        with (
            new_connection(base) as c,
            c.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "the next turn"}) as r,
        ):
            assert r.status_code == 200
            assert events_of(r)[-1].event == "turn.completed"

        # the survivor's turns are cancelled through any connection: the cancellation is durable, in the store
        for turn in turns[survivor]:
            with new_connection(base) as c:
                assert c.put(f"/api/runs/{turn['run_id']}/cancellation").json()["state"] == "requested"
            with new_connection(base) as c:
                url = f"/api/sessions/{turn['session_id']}/turns/{turn['turn_id']}"
                until(lambda url=url: c.get(url).json()["status"] == "cancelled", "the survivor's turn is cancelled")
    finally:
        process.terminate()
        try:
            process.wait(30)
        except Exception:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0


def test_workers_that_cannot_start_stop_the_server_with_the_reason(fleet_env: dict[str, str], tmp_path: Path) -> None:
    """Each worker builds its own app: one that cannot (a host tool that does not import) stops them all, and
    the command fails as one process would, naming the cause."""
    (tmp_path / "fleet.toml").write_text('[[tools]]\npath = "no_such_module_here:search"\n')
    result = subprocess.run(
        [sys.executable, "-m", "fleet_api", "serve", "--port", str(free_port()), "--workers", "2"],
        env={**os.environ, **fleet_env, "FLEET_CONFIG": str(tmp_path / "fleet.toml")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "tools[0].path: cannot import 'no_such_module_here:search'" in result.stderr
    assert result.stderr.rstrip().endswith("see the log above"), result.stderr[-500:]
