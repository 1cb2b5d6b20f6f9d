"""An SSE client watching a turn whose LM streams: the tokens arrive before the step, as ``lm.delta``."""

from __future__ import annotations

import httpx
from live_api import events_of, iter_frames
from scripted_lm import ScriptedLM, step

REASONING = "First I read the task, then I plan the code, then I write it. " * 10


def test_sse_client_sees_deltas_before_the_step(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.token_delay_s = 0.005
    scripted_lm.add("stream to me", [step(REASONING, "print('hi')"), step("Done.", "SUBMIT(answer='ok')")])
    seen = []
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "stream to me"}) as r:
        for frame in iter_frames(r):
            if frame.event:
                seen.append(frame)
            if frame.event == "lm.delta":
                break  # drop the connection mid-stream, then resume from here
    assert all(f.event != "reasoning" for f in seen)
    turn_id = seen[0].envelope["turn_id"]
    url = f"/api/sessions/{session_id}/turns/{turn_id}/events"
    with client.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
        frames = seen + events_of(r)
    assert [int(f.id or 0) for f in frames] == list(range(1, len(frames) + 1))
    types = [f.event for f in frames]
    assert types[-1] == "turn.completed"
    reasoning = types.index("reasoning")
    assert types.index("lm.delta") < reasoning
    pieces = [f.envelope["data"] for f in frames[:reasoning] if f.event == "lm.delta"]
    assert "".join(p["text"] for p in pieces if p["field"] == "reasoning") == frames[reasoning].envelope["data"]["text"]
    assert "".join(p["text"] for p in pieces if p["field"] == "code") == "print('hi')"
    with client.stream("GET", url) as r:  # a late reader replays the same events from the store
        assert [f.data for f in events_of(r)] == [f.data for f in frames]
