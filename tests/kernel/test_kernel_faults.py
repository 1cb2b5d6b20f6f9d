"""A notebook kernel killed with SIGKILL mid-turn: the API on the same store finds the dead owner at the
next request, marks the turn `interrupted`, closes its watchers' stream and takes a new turn at once."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest
from live_api import LiveServer, events_of
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings

SLOW = {"delay": 60, **step("Think slowly.", "SUBMIT(answer='too late')")}
TAKEOVER_S = 5.0  # a generous bound, not a timing


def _running_turn(client: httpx.Client) -> tuple[str, str]:
    """The session and turn the kernel is running, once the store shows it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for ses in client.get("/api/sessions").json()["sessions"]:
            for turn in client.get(f"/api/sessions/{ses['session_id']}/turns").json()["turns"]:
                if turn["status"] == "running":
                    return ses["session_id"], turn["turn_id"]
        time.sleep(0.1)
    raise AssertionError("the kernel's turn never showed in the store")


@pytest.mark.slow
def test_a_killed_kernel_s_session_takes_a_new_turn_at_once(
    start_kernel: Any, settings: Settings, scripted_lm: ScriptedLM
) -> None:
    kernel = start_kernel()
    scripted_lm.add("a slow kernel turn", [SLOW])
    kernel.submit("a slow kernel turn")
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id, turn_id = _running_turn(client)
        os.kill(kernel.km.provisioner.pid, signal.SIGKILL)

        scripted_lm.add("after the crash", [step("Answer.", "SUBMIT(answer='back')")])
        deadline = time.monotonic() + TAKEOVER_S
        while True:
            response = client.post(f"/api/sessions/{session_id}/turns", json={"task": "after the crash"},
                                   headers={"Prefer": "respond-async"})  # fmt: skip
            if response.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert response.status_code == 202, response.text
        old = client.get(f"/api/sessions/{session_id}/turns/{turn_id}").json()
        assert old["status"] == "interrupted", old
        with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as r:
            frames = events_of(r)
        assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1))
        assert frames[-1].event == "turn.failed" and frames[-1].envelope["data"]["error"]["type"] == "interrupted"
