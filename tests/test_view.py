"""Tests for fleet_kernel.view: the one fold of a turn's typed events, and what the renderers make of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import parse_event
from fleet_kernel.store import Store
from fleet_kernel.transcript import render_html, render_markdown, render_text
from fleet_kernel.view import TurnView

REASONING = "Count the words of the task first."
CODE = "words = task.split()\nprint('the task has', len(words), 'words')\nhelp_ = llm_query('say hi')"
OUTPUT = "the task has 5 words"
ANSWER = "five words, checked twice"


async def _scripted_turn(fleet_env: dict[str, str], tmp_path: Path, store: Store, lm: ScriptedLM) -> list[Any]:
    lm.add("*", [step(REASONING, CODE), step("Done.", "SUBMIT(answer='five words, ' + 'checked twice')")])
    config = tmp_path / "fleet.toml"
    config.write_text("[limits]\nmax_iters = 5\n")
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "how many words are here?")
        return [event async for event in handle.events()]
    finally:
        await runner.close()


async def test_a_real_turn_folds_into_the_view_every_renderer_shows(
    fleet_env: dict[str, str], tmp_path: Path, store: Store, scripted_lm: ScriptedLM
) -> None:
    events = await _scripted_turn(fleet_env, tmp_path, store, scripted_lm)
    view = TurnView.of(events)

    assert view.status == "completed" and view.answer == ANSWER and view.task == "how many words are here?"
    first, second = view.iterations
    assert (first.iteration, first.max_iters, first.reasoning, first.code) == (1, 5, REASONING, CODE)
    assert OUTPUT in first.output and first.duration_ms is not None and first.error is None
    assert first.tools == ["llm_query(say hi)"] and first.finished and second.finished
    assert view.lm_calls == 3 and view.sub_lm_calls == 1 and view.tokens > 0

    for rendered in (render_text(view), render_markdown(view)):
        for shown in (REASONING, "print('the task has', len(words), 'words')", OUTPUT, ANSWER):
            assert rendered.count(shown) == 1, (shown, rendered)
    page = render_html(view)
    for shown in (REASONING, OUTPUT, ANSWER):
        assert page.count(shown) == 1, shown

    # The stored envelopes, parsed back from their JSON, fold into the same view.
    stored = [parse_event(json.loads(e.to_json()))[0] for e in await store.events_after(events[0].turn_id)]
    assert TurnView.of(stored) == view


def test_streamed_text_is_live_only_and_the_step_replaces_it() -> None:
    from fleet_kernel.events import make_event

    def fold(types_and_data: list[tuple[str, dict[str, Any]]]) -> TurnView:
        where = {"session_id": "s", "turn_id": "t"}
        return TurnView.of(make_event(t, d, seq=n, **where) for n, (t, d) in enumerate(types_and_data, 1))

    start = [("iteration.started", {"iteration": 1, "max_iters": 5})]
    delta = {"iteration": 1, "call_id": "lm-1"}
    streamed = [
        ("lm.delta", {**delta, "field": "reasoning", "text": "Count the "}),
        ("lm.delta", {**delta, "field": "reasoning", "text": "words"}),
        ("lm.delta", {**delta, "field": "code", "text": "words = "}),
    ]
    live = fold(start + streamed).iterations[0]
    assert (live.reasoning, live.shown_reasoning, live.shown_code) == ("", "Count the words", "words = ")
    retried = fold([*start, *streamed, ("lm.delta", {**delta, "call_id": "lm-1.2", "field": "reasoning", "text": "C"})])
    assert retried.iterations[0].shown_reasoning == "C" and retried.iterations[0].shown_code == ""  # afresh
    step_events = [("reasoning", {"iteration": 1, "text": REASONING}), ("code", {"iteration": 1, "code": CODE})]
    with_deltas, without = fold(start + streamed + step_events), fold(start + step_events)
    assert with_deltas.iterations[0].shown_reasoning == REASONING and with_deltas.iterations[0].live_code == ""
    for render in (render_markdown, render_text, render_html):
        assert render(with_deltas) == render(without)  # transcripts never show deltas
