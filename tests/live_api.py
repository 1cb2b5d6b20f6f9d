"""A real Fleet API for tests: uvicorn on a free loopback port in a thread, and an SSE client that reads
``text/event-stream`` as a browser does. Used by the API suites and by any suite that needs the API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from fleet_api.server import build_server
from fleet_kernel.config import Settings
from fleet_kernel.store import migrate

HEARTBEAT_S = 0.3


class LiveServer:
    """The app under uvicorn in a thread of this process, on 127.0.0.1 and a port the OS picks."""

    def __init__(self, settings: Settings, **app_options: float) -> None:
        if not settings.database_url.startswith("sqlite"):
            migrate.upgrade(settings.database_url)
        self.server = build_server("127.0.0.1", 0, settings, **{"heartbeat_s": HEARTBEAT_S, **app_options})
        self.thread = threading.Thread(target=self.server.run, name="fleet-api-test", daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def app(self) -> Any:
        return self.server.config.app


# ---------------------------------------------------------------------- SSE client


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.data)  # type: ignore[no-any-return]


def iter_frames(response: httpx.Response) -> Iterator[Frame]:
    """Parse ``text/event-stream`` as a browser would: frames end at a blank line."""
    frame = Frame()
    for line in response.iter_lines():
        if line == "":
            if frame.id is not None or frame.event is not None or frame.data or frame.comments:
                yield frame
            frame = Frame()
        elif line.startswith(":"):
            frame.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                frame.id = value
            elif name == "event":
                frame.event = value
            elif name == "data":
                frame.data = f"{frame.data}\n{value}" if frame.data else value


def events_of(response: httpx.Response) -> list[Frame]:
    """Every event frame of a stream (heartbeat comments dropped), read to its end."""
    return [f for f in iter_frames(response) if f.event is not None]


def frames_until(response: httpx.Response, event_type: str) -> list[Frame]:
    """Event frames up to and including the first of ``event_type``; the rest of the stream is left unread."""
    frames = []
    for frame in iter_frames(response):
        if frame.event is not None:
            frames.append(frame)
            if frame.event == event_type:
                break
    return frames


def run_turn(client: httpx.Client, session_id: str, task: str, **headers: str) -> list[Frame]:
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": task}, headers=headers) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return events_of(r)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The contract's error body, with no trace of Python internals."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str)
    if code is not None:
        assert body["error"]["code"] == code, body
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body["error"]  # type: ignore[no-any-return]
