"""SSE frame encoding and the finished-turn cache."""

from __future__ import annotations

import json

from fleet_api.frames import FrameCache
from fleet_kernel.events import Event, make_event


def log(turn_id: str, n: int, *, terminal: bool = True) -> list[Event]:
    events = [
        make_event(
            "reasoning", {"iteration": 1, "text": f"line {i}\nwith a newline"}, seq=i, session_id="s", turn_id=turn_id
        )
        for i in range(1, n)
    ]
    last = ("turn.cancelled", {"reason": "x"}) if terminal else ("reasoning", {"iteration": 1, "text": "x"})
    return [*events, make_event(last[0], last[1], seq=n, session_id="s", turn_id=turn_id)]


def test_frame_shape() -> None:
    event = log("t", 1)[0]
    frame = FrameCache().encode(event).decode()
    lines = frame.split("\n")
    assert lines[:2] == ["id: 1", "event: turn.cancelled"] and frame.endswith("\n\n")
    assert json.loads(lines[2].removeprefix("data: ")) == json.loads(event.to_json())


def test_multiline_text_stays_one_data_line() -> None:
    frame = FrameCache().encode(log("t", 2)[0]).decode()
    assert frame.count("\ndata: ") == 1 and "line 1\\nwith a newline" in frame


def test_only_complete_logs_are_kept() -> None:
    cache = FrameCache()
    assert cache.keep_finished(log("a", 3, terminal=False)) is None
    assert cache.keep_finished(log("b", 3)[1:]) is None  # starts at seq 2
    assert cache.keep_finished([]) is None
    assert cache.finished("a") is None and cache.finished("b") is None
    frames = cache.keep_finished(log("c", 3))
    assert frames is not None and cache.finished("c") == frames and len(frames) == 3


def test_bounded_and_forgettable() -> None:
    one = sum(map(len, FrameCache().keep_finished(log("x", 10)) or []))
    cache = FrameCache(max_bytes=one * 2 + 10)
    for name in ("a", "b", "c"):
        cache.keep_finished(log(name, 10))
    assert cache.finished("a") is None and cache.finished("b") and cache.finished("c")
    cache.forget(["b", "missing"])
    assert cache.finished("b") is None and cache.finished("c")
