"""Faults recover in seconds, over real servers on a real store.

A `fleet serve` killed with SIGKILL mid-turn: its turn is `interrupted` (the stream ends with
`turn.failed`) as soon as a restarted server or the next request looks, and the session takes a new turn
at once. A full disk under FLEET_HOME: the turn fails naming the disk, watchers get that terminal event,
no event after an uncommitted one is ever shown, and /api/health says the store cannot be written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from disk_fill import fill_disk
from live_api import Frame, LiveServer, events_of, frames_until
from ports import free_port
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.kernel.sidecar import spawn_sidecar

# The model takes a minute to answer: the turn is mid-flight when its process is killed.
SLOW = {"delay": 60, **step("Think slowly.", "SUBMIT(answer='too late')")}
DONE = step("Answer.", "SUBMIT(answer='done')")
TAKEOVER_S = 5.0  # how soon a dead owner's session must take a new turn (a generous bound, not a timing)


def start_async(client: httpx.Client, session_id: str, task: str) -> httpx.Response:
    return client.post(f"/api/sessions/{session_id}/turns", json={"task": task}, headers={"Prefer": "respond-async"})


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as the OOM killer or a crash would: no shutdown code runs."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(20)


def start_within(client: httpx.Client, session_id: str, task: str, bound_s: float = TAKEOVER_S) -> httpx.Response:
    """POST a turn until the session takes it, for at most ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while True:
        response = start_async(client, session_id, task)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


class Watcher(threading.Thread):
    """An SSE client reading a turn's whole stream in the background."""

    def __init__(self, base_url: str, path: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.path = base_url, path
        self.frames: list[Frame] = []
        self.connected = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as c, c.stream("GET", self.path) as r:
            self.connected.set()
            self.frames = events_of(r)


def assert_interrupted(frames: list[Frame]) -> None:
    assert frames, "the watcher got no event"
    assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1))
    assert frames[-1].event == "turn.failed", [f.event for f in frames]
    assert frames[-1].envelope["data"]["error"]["type"] == "interrupted"


@pytest.fixture
def doomed(fleet_env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """A `fleet serve` process that the test kills."""
    port = free_port()
    process = spawn_sidecar(port, env=fleet_env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield process, client
    finally:
        if process.poll() is None:
            kill_hard(process)


def _slow_turn(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> dict[str, str]:
    scripted_lm.add("a slow turn", [SLOW])
    turn = start_async(client, session_id, "a slow turn").json()
    url = f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events"
    with client.stream("GET", url) as r:
        assert frames_until(r, "turn.started")[-1].event == "turn.started"
    return turn


@pytest.mark.slow
def test_a_restarted_server_takes_over_the_session_of_a_killed_one(
    doomed: tuple[subprocess.Popen[bytes], httpx.Client], fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    process, first = doomed
    session_id = first.post("/api/sessions", json={}).json()["session_id"]
    turn = _slow_turn(first, session_id, scripted_lm)
    kill_hard(process)

    port = free_port()
    second = spawn_sidecar(port, env=fleet_env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            scripted_lm.add("the next turn", [DONE])
            response = start_within(client, session_id, "the next turn")
            assert response.status_code == 202, response.text
            old = client.get(f"/api/sessions/{session_id}/turns/{turn['turn_id']}").json()
            assert old["status"] == "interrupted" and "stopped before it finished" in old["error"]["message"]
            with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events") as r:
                assert_interrupted(events_of(r))
    finally:
        second.terminate()
        second.wait(20)


@pytest.mark.slow
def test_the_next_request_takes_over_a_killed_server_s_session(
    doomed: tuple[subprocess.Popen[bytes], httpx.Client], live: LiveServer, client: httpx.Client,
    session_id: str, scripted_lm: ScriptedLM,
) -> None:  # fmt: skip
    process, other = doomed
    turn = _slow_turn(other, session_id, scripted_lm)
    watcher = Watcher(live.url, f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events")
    watcher.start()
    assert watcher.connected.wait(30)
    kill_hard(process)

    scripted_lm.add("the next turn", [DONE])
    response = start_within(client, session_id, "the next turn")
    assert response.status_code == 202, response.text
    watcher.join(30)
    assert not watcher.is_alive(), "the watcher of the killed turn never got its terminal event"
    assert_interrupted(watcher.frames)
    assert client.get(f"/api/sessions/{session_id}/turns/{turn['turn_id']}").json()["status"] == "interrupted"


# ---------------------------------------------------------------------- an unwritable store


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs to fill: a full disk without touching the machine's own."""
    if os.environ.get("FLEET_TEST_DATABASE_URL"):
        pytest.skip("fills the disk of a SQLite store; this run's store is elsewhere")
    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a small tmpfs, which needs root to mount")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_fails_the_turn_without_a_gap_and_health_says_so(
    small_disk: Path, fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    home = small_disk / "home"
    home.mkdir()
    settings: Settings = load_settings({**fleet_env, "FLEET_HOME": str(home)})
    steps = [{"delay": 0.3, **step(f"Step {i}.", f"print('step {i}')")} for i in range(30)]
    scripted_lm.add("fills the disk", [*steps, DONE])
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        assert client.get("/api/health").json()["store"]["ok"] is True
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        turn = start_async(client, session_id, "fills the disk").json()
        url = f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events"
        watcher = Watcher(live.url, url)
        watcher.start()
        with client.stream("GET", url) as r:
            frames_until(r, "output")  # the turn is under way
        fill_disk(small_disk / "filler")
        try:
            watcher.join(60)
            assert not watcher.is_alive(), "the watcher never got a terminal event while the disk was full"
            frames = watcher.frames
            assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1)), "a gap was published"
            assert frames[-1].event == "turn.failed", [f.event for f in frames]
            error = frames[-1].envelope["data"]["error"]
            assert error["type"] == "store_unwritable" and "full" in error["message"], error

            health = client.get("/api/health")
            assert health.status_code == 503, health.text
            assert health.json()["store"]["ok"] is False and "full" in health.json()["store"]["detail"]
        finally:
            (small_disk / "filler").unlink()

        deadline = time.monotonic() + 30  # the failure is stored as soon as there is room again
        while client.get(f"/api/sessions/{session_id}/turns/{turn['turn_id']}").json()["status"] == "running":
            assert time.monotonic() < deadline, "the turn stayed running after space came back"
            time.sleep(0.2)
        row = client.get(f"/api/sessions/{session_id}/turns/{turn['turn_id']}").json()
        assert row["status"] == "failed" and "full" in row["error"]["message"]
        with client.stream("GET", url) as r:
            stored = events_of(r)
        assert [(f.id, f.event) for f in stored] == [(f.id, f.event) for f in frames]  # the same story, replayed
        health = client.get("/api/health")
        assert health.status_code == 200 and health.json()["store"]["ok"] is True, health.text


@pytest.mark.own_server  # it deletes the store's file
def test_health_reports_a_deleted_database_file(live: LiveServer, client: httpx.Client, settings: Settings) -> None:
    if not settings.database_url.startswith("sqlite"):
        pytest.skip("deletes the file of a SQLite store")
    assert client.get("/api/health").json()["store"]["ok"] is True
    database = Path(settings.database_url.split(":///", 1)[1])
    for path in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        path.unlink(missing_ok=True)
    health = client.get("/api/health")
    assert health.status_code == 503, health.text
    body = health.json()
    assert body["status"] == "degraded" and body["store"]["ok"] is False
    assert "deleted" in body["store"]["detail"]
