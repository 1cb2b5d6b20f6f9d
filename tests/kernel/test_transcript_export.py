"""Tests for fleet_kernel.transcript: stored events as a transcript and a session as a notebook."""

from __future__ import annotations

import base64

import nbformat

from fleet_kernel.events import make_event
from fleet_kernel.transcript import IterationView, TurnView, render_text, session_notebook, transcript_bundle

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


async def _turn(store, session_id: str, task: str, outcome: tuple[str, dict]) -> str:
    turn, _ = await store.claim_turn(session_id, task)
    art = await store.add_artifact(
        session_id=session_id, turn_id=turn.turn_id, path="artifacts/p.png", mime="image/png", data=PNG
    )
    limits = {"max_iters": 5, "max_llm_calls": 5, "timeout_s": 60, "exec_timeout_s": 10}
    steps = [
        ("turn.started", {"task": task, "run_id": turn.run_id, "model": "m", "sandbox": "local", "limits": limits}),
        ("iteration.started", {"iteration": 1, "max_iters": 5}),
        ("reasoning", {"iteration": 1, "text": "look at <b>the</b> data"}),
        ("code", {"iteration": 1, "code": "print('<script>')"}),
        ("output", {"iteration": 1, "stream": "stdout", "text": "<script>\n"}),
        ("execution.finished", {"iteration": 1, "duration_ms": 12.0, "error": None}),
        (
            "lm.finished",
            {"role": "root", "model": "m", "duration_ms": 5, "usage": {"prompt_tokens": 10, "completion_tokens": 5}},
        ),
        (
            "artifact",
            {
                "artifact_id": art.artifact_id,
                "path": art.path,
                "mime": art.mime,
                "size": art.size,
                "sha256": art.sha256,
            },
        ),
        outcome,
    ]
    events = [
        make_event(t, d, seq=i + 1, session_id=session_id, turn_id=turn.turn_id) for i, (t, d) in enumerate(steps)
    ]
    await store.append_events(events)
    status = outcome[0].split(".")[1]
    await store.finish_turn(turn.turn_id, status, answer=outcome[1].get("answer"))
    return turn.turn_id


async def test_transcript_escapes_html_and_carries_metadata(store) -> None:
    ses = await store.create_session("t")
    done = ("turn.completed", {"answer": "The **answer** <img src=x>", "usage": {"lm_calls": 1}, "duration_ms": 50})
    turn_id = await _turn(store, ses.session_id, "what?", done)
    view = TurnView.of(await store.events_after(turn_id))
    data, meta = transcript_bundle(view)
    assert meta == {"fleet": {"session_id": ses.session_id, "turn_id": turn_id, "status": "completed", "model": "m"}}
    assert "<script>" not in data["text/html"] and "&lt;script&gt;" in data["text/html"]
    assert "<img" not in data["text/html"] and "<strong>answer</strong>" in data["text/html"]
    assert "```python\nprint('<script>')\n```" in data["text/markdown"]
    assert "── answer" in data["text/plain"] and "The **answer**" in data["text/plain"]


async def test_session_notebook_is_valid_and_has_one_cell_per_turn(store) -> None:
    ses = await store.create_session("t")
    await _turn(
        store, ses.session_id, "first task", ("turn.completed", {"answer": "one", "usage": {}, "duration_ms": 1})
    )
    await _turn(store, ses.session_id, "second task", ("turn.cancelled", {"reason": "interrupted"}))
    nb = await session_notebook(store, ses.session_id)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "fleet"
    title, *turns = nb.cells
    assert title.cell_type == "markdown" and title.source.startswith("# t\n") and "`m`" in title.source
    assert [c.source for c in turns] == ["first task", "second task"]
    first, second = (c.outputs for c in turns)
    assert [o.output_type for o in first] == ["display_data", "execute_result"]
    assert first[0].data["image/png"] == base64.b64encode(PNG).decode()
    assert [o.output_type for o in second] == ["display_data", "execute_result", "error"]
    assert second[2].ename == "TurnCancelled" and second[1].metadata["fleet"]["status"] == "cancelled"


def test_long_output_is_clipped_with_a_note() -> None:
    view = TurnView(turn_id="t")
    view.iterations.append(IterationView("root", 1, 3, output="x" * 10_000))
    assert "more characters" in render_text(view)
