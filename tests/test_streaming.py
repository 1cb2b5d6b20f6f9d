"""Streamed LM calls: real turns (runner, sandbox, store) against the scripted LM streaming at a pace.

The field splitter and the coalescer are checked on their own first; then whole turns: deltas come
before the step's events and add up to its text, a streamed turn uses exactly what a whole-reply turn
uses, a token budget stops a call mid-stream, and a cancel ends a slow stream at once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, chat_adapter_text, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.deltas import DeltaCoalescer, FieldSplitter
from fleet_kernel.engine.observe import strip_code
from fleet_kernel.events import Event
from fleet_kernel.redact import Redactor
from fleet_kernel.store import Store

LONG_REASONING = "Let me think this through step by step. " * 40  # ~1,600 characters: 400 chunks of 4


# ---------------------------------------------------------------------- the splitter and the coalescer


@pytest.mark.parametrize(
    "fields",
    [
        {"reasoning": "think hard\n\nabout it  ", "code": "```python\nprint(1)\nx = '`a`'\n```"},
        {"reasoning": "  a [[ ## not a header", "code": "print(2)\n\n"},
        {"reasoning": "multi\nline\n[[ partial", "code": "```\nfor i in range(3):\n    print(i)\n```\nwords after"},
        {"reasoning": "", "code": "y = 1"},
    ],
)
def test_split_pieces_add_up_to_the_parsed_fields(fields: dict[str, str]) -> None:
    text = chat_adapter_text(fields)
    rng = random.Random(7)
    for _ in range(100):
        splitter, got, at = FieldSplitter(), {"reasoning": "", "code": ""}, 0
        while at < len(text):
            size = rng.randint(1, 9)
            for name, piece in splitter.feed(text[at : at + size]):
                got[name] += piece
            at += size
        assert got == {"reasoning": fields["reasoning"].strip(), "code": strip_code(fields["code"])}


def test_a_header_is_held_back_only_while_it_may_be_one() -> None:
    splitter = FieldSplitter()
    assert splitter.feed("[[ ## reasoning ## ]]\nLook") == [("reasoning", "Look")]
    assert splitter.feed(" here.\n[[ ## co") == [("reasoning", " here.")]  # the header may come
    assert splitter.feed("de ## ]]\nprint(") == [("code", "print(")]


def test_coalescer_bounds_parts_and_flushes_a_pause() -> None:
    parts: list[tuple[str, str]] = []
    coalescer = DeltaCoalescer(lambda name, text: parts.append((name, text)))
    for _ in range(2000):  # 8,000 characters at once: parts of 256, not 2,000 of 4
        coalescer.add("reasoning", "abcd")
    assert len(parts) <= 8000 // 256 + 2
    coalescer.add("reasoning", "tail")
    time.sleep(0.2)  # a pause: the timer hands over what waits
    assert "".join(t for _, t in parts) == "abcd" * 2000 + "tail"
    coalescer.add("code", "x = 1")
    coalescer.close()
    assert parts[-1] == ("code", "x = 1") and coalescer.parts == len(parts)


def test_coalescers_wait_on_one_thread_not_one_each() -> None:
    """A streamed reply waits for its next part ~every 50 ms: a thread per wait (``threading.Timer``) cost
    ~150 us of CPU each, more than reading the chunks; with 50 replies streaming at once, 50 threads."""
    parts: list[str] = []
    before = threading.active_count()
    coalescers = [DeltaCoalescer(lambda name, text: parts.append(text)) for _ in range(50)]
    for coalescer in coalescers:
        coalescer.add("reasoning", "first")  # goes out at once
        coalescer.add("reasoning", "second")  # waits for the timer
    assert threading.active_count() <= before + 1
    deadline = time.monotonic() + 30
    while parts.count("second") < 50:
        assert time.monotonic() < deadline, "the waiting parts were never handed over"
        time.sleep(0.01)
    for coalescer in coalescers:
        coalescer.close()
    assert parts.count("first") == parts.count("second") == 50


def test_coalescer_never_shows_half_a_secret() -> None:
    secret = "sk-live-0123456789abcdef"
    redactor = Redactor((secret,))
    parts: list[str] = []
    coalescer = DeltaCoalescer(lambda name, text: parts.append(text), hold=redactor.unsafe_tail, interval_s=0)
    for piece in ["the key is sk-", "live-0123", "456789abcdef, said", " nobody"]:
        coalescer.add("reasoning", piece)
    coalescer.close()
    assert "".join(parts) == f"the key is {secret}, said nobody"
    assert sum(secret in part for part in parts) == 1  # whole in one part, so the emitter masks it
    assert all(redactor.unsafe_tail(part) == 0 for part in parts)  # no part ends in the start of the key


# ---------------------------------------------------------------------- whole turns


@pytest.fixture
async def make_runner(fleet_env: dict[str, str], tmp_path: Path, store: Store) -> AsyncIterator[Callable[..., Any]]:
    runners: list[TurnRunner] = []

    async def build(toml: str = "", **env: str) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text(toml)
        settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": "local", **env})
        runner = await TurnRunner(store, settings).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def collect(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    return [event async for event in handle.events()]


def deltas(events: list[Event], name: str, iteration: int = 1) -> str:
    return "".join(
        e.data["text"]
        for e in events
        if e.type == "lm.delta" and e.data["field"] == name and e.data["iteration"] == iteration
    )


@pytest.mark.slow
async def test_deltas_come_first_and_add_up_to_the_step(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.token_delay_s = 0.005
    scripted_lm.add("*", [
        step(LONG_REASONING, "```python\nprint('hello')\n```"),
        step("Done.", "SUBMIT(answer='42')"),
    ])  # fmt: skip
    runner = await make_runner()
    session = await store.create_session()
    events = await collect(runner, session.session_id, "stream it")
    types = [e.type for e in events]
    assert types[-1] == "turn.completed"
    first_delta, reasoning = types.index("lm.delta"), types.index("reasoning")
    assert first_delta < types.index("lm.finished") < reasoning
    assert deltas(events, "reasoning") == events[reasoning].data["text"] == LONG_REASONING.strip()
    assert deltas(events, "code") == events[types.index("code")].data["code"] == "print('hello')"
    # coalesced: ~400 chunks of reasoning became fewer rows (a few dozen on a quiet machine), not one per token
    assert 2 <= sum(e.type == "lm.delta" and e.data["iteration"] == 1 for e in events) < len(LONG_REASONING) // 4 // 2
    assert all(body.get("stream") is True for body in scripted_lm.requests)
    assert all(body["stream_options"] == {"include_usage": True} for body in scripted_lm.requests)


async def test_a_streamed_turn_uses_what_a_whole_reply_turn_uses(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    steps = [
        step("Look first.", "print(llm_query('what is 6*7?'))"),
        step("Done.", "SUBMIT(answer='42')"),
    ]
    runs = {}
    for stream in (True, False):
        scripted_lm.add("*", steps)
        runner = await make_runner(f"[lm]\nstream = {json.dumps(stream)}\n")
        session = await store.create_session()
        asked = len(scripted_lm.requests)
        events = await collect(runner, session.session_id, "the same task")
        bodies = scripted_lm.requests[asked:]
        runs[stream] = (events, bodies)
    (streamed, streamed_bodies), (whole, whole_bodies) = runs[True], runs[False]
    assert any(e.type == "lm.delta" for e in streamed) and not any(e.type == "lm.delta" for e in whole)
    assert [b.get("stream") for b in whole_bodies] == [None] * len(whole_bodies)

    def finished(events: list[Event]) -> list[dict[str, Any]]:
        return [
            {k: e.data[k] for k in ("role", "usage", "cost_usd", "finish_reason")}
            for e in events
            if e.type == "lm.finished"
        ]

    assert finished(streamed) == finished(whole)
    assert streamed[-1].data["answer"] == whole[-1].data["answer"] == "42"
    assert streamed[-1].data["usage"] == whole[-1].data["usage"]
    caps = [{k: v for k, v in b.items() if "tokens" in k} for b in streamed_bodies]
    assert caps == [{k: v for k, v in b.items() if "tokens" in k} for b in whole_bodies] and caps[0]


@pytest.mark.slow
async def test_a_token_budget_stops_a_call_mid_stream(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.token_delay_s = 0.002
    scripted_lm.add("*", [step("x " * 20_000, "print(1)")])  # ~10,000 completion tokens, 10,000 chunks
    runner = await make_runner("[limits]\nmax_turn_tokens = 4000\n")
    session = await store.create_session()
    started = time.monotonic()
    events = await collect(runner, session.session_id, "think at length")
    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "budget_exceeded"
    assert time.monotonic() - started < 15  # all of it would take 20 s of streaming
    lm_finished = next(e for e in events if e.type == "lm.finished")
    assert lm_finished.data["finish_reason"] == "stopped"
    used = lm_finished.data["usage"]["prompt_tokens"] + lm_finished.data["usage"]["completion_tokens"]
    assert 4000 <= used < 4100  # stopped as it reached the budget, not after the whole reply
    await wait_for(lambda: bool(scripted_lm.streamed))
    assert scripted_lm.streamed[0] < 10_000 // 2 and scripted_lm.disconnects  # the provider request was closed
    turn = await store.get_turn(events[0].turn_id)
    assert turn.usage["prompt_tokens"] + turn.usage["completion_tokens"] == used


async def test_cancel_ends_a_slow_stream_at_once(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.token_delay_s = 0.3  # ~200 chunks: a minute
    scripted_lm.add("*", [step("slowly " * 100, "print(1)")])
    runner = await make_runner()
    session = await store.create_session()
    handle = await runner.start(session.session_id, "think slowly")
    seen: list[Event] = []
    stopped = 0.0
    async for event in handle.events():
        seen.append(event)
        if event.type == "lm.delta" and not stopped:
            stopped = time.monotonic()
            handle.cancel("stopped by the user")
    assert seen[-1].type == "turn.cancelled" and time.monotonic() - stopped < 2
    await wait_for(lambda: bool(scripted_lm.streamed))
    assert scripted_lm.streamed[0] < 20 and scripted_lm.disconnects  # the provider saw the client leave


async def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_scripted_lm_streams_the_whole_reply_as_chunks() -> None:
    """The scripted LM's stream is the OpenAI format: the same text, finish reason and usage."""
    import httpx

    with ScriptedLM({"*": [step("r", "c")] * 2}, token_chars=3) as lm:
        body = {"model": "scripted", "messages": [{"role": "system", "content": "[[ ## x ## ]]"}]}
        whole = httpx.post(f"{lm.base_url}/chat/completions", json=body).json()
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{lm.base_url}/chat/completions", json=stream) as response:
            assert response.headers["content-type"] == "text/event-stream"
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"] == whole["usage"] and chunks[-1]["choices"] == []


@pytest.mark.slow
async def test_a_cassette_records_the_stream_and_replays_it_as_one(
    make_runner, store: Store, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.token_delay_s = 0.01
    scripted_lm.add("*", [step(LONG_REASONING, "print('hi')"), step("Done.", "SUBMIT(answer='42')")])
    cassette = tmp_path / "streamed.cassette.json"
    recorder = await make_runner(FLEET_LM_RECORD=str(cassette))
    recorded = await collect(recorder, (await store.create_session()).session_id, "record me")
    assert recorded[-1].type == "turn.completed"
    response = json.loads(cassette.read_text())["exchanges"][0]["response"]
    pieces = response["stream"]
    assert sum(size for _, size in pieces) == len(response["text"]) and len(pieces) > 100  # 4-char chunks
    assert 0.005 < sum(pause for pause, _ in pieces) / len(pieces) < 0.1  # the recorded pace

    for pace in ("recorded", "at_once"):
        player = await make_runner(f'[lm]\nreplay_pace = "{pace}"\n', FLEET_LM_MODEL=f"replay/{cassette}")
        started = time.monotonic()
        replayed = await collect(player, (await store.create_session()).session_id, "record me")
        took = time.monotonic() - started
        assert replayed[-1].type == "turn.completed" and replayed[-1].data["answer"] == "42"
        assert deltas(replayed, "reasoning") == LONG_REASONING.strip() == deltas(recorded, "reasoning")
        types = [e.type for e in replayed]
        assert types.index("lm.delta") < types.index("reasoning")
        if pace == "recorded":
            assert took > sum(pause for pause, _ in pieces) * 0.8  # at the recorded pace
            paced = took
        else:
            assert took < paced


@pytest.mark.parametrize("stream", [True, False])
async def test_the_providers_thinking_is_kept_on_lm_finished(
    make_runner, store: Store, scripted_lm: ScriptedLM, stream: bool
) -> None:
    thinking = "The user wants 42. I will submit it directly."
    scripted_lm.add("*", [{"reasoning": "Done.", "code": "SUBMIT(answer='42')", "reasoning_content": thinking}])
    runner = await make_runner(f"[lm]\nstream = {json.dumps(stream)}\n")
    events = await collect(runner, (await store.create_session()).session_id, "think first")
    finished = next(e for e in events if e.type == "lm.finished")
    assert finished.data["reasoning_content"] == thinking
    assert finished.data["reasoning_tokens"] == len(thinking) // 4
    usage = finished.data["usage"]
    assert usage["completion_tokens"] >= len(thinking) // 4  # the thinking is counted in the call's usage
    assert events[-1].data["usage"]["completion_tokens"] == usage["completion_tokens"]
    from fleet_kernel.transcript import transcript_bundle
    from fleet_kernel.view import TurnView

    view = TurnView.of(events)
    assert view.iterations[0].thinking == [thinking]
    assert "<details><summary>the model's thinking" in transcript_bundle(view)[0]["text/html"]


def test_a_provider_that_cannot_stream_gets_the_whole_reply_request() -> None:
    from collections.abc import Generator

    from dspy.lm15 import Message, Request, Response, TextPart, UnsupportedFeatureError, Usage

    from fleet_kernel.engine.streaming import CallStream, read_as_stream, streaming

    request = Request(model="m", messages=(Message.user("hi"),))
    message = Message.assistant([TextPart("whole")])
    reply = Response(id=None, model="m", message=message, finish_reason="stop", usage=Usage(input_tokens=1))
    asked: list[str] = []

    def no_stream(_: Request) -> Generator[Any, None, None]:
        asked.append("stream")
        raise UnsupportedFeatureError("this provider does not support stream.")
        yield

    def whole(_: Request) -> Response:
        asked.append("whole")
        return reply

    opened: list[str] = []
    call = CallStream(open=lambda: opened.append("sink"), check=lambda tokens: None, stopped=lambda usage: None)  # type: ignore[arg-type,return-value]
    with streaming(call):
        assert read_as_stream(request, no_stream, whole) is reply
    assert asked == ["stream", "whole"] and not opened  # refused before any I/O: one whole request, no sink
    assert read_as_stream(request, no_stream, whole) is reply and asked[-1] == "whole"  # nobody listening


async def test_a_stream_without_usage_is_metered_by_estimate(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.stream_usage = False
    scripted_lm.add("*", [step("Done.", "SUBMIT(answer='42')")])
    runner = await make_runner()
    events = await collect(runner, (await store.create_session()).session_id, "no usage")
    usage = next(e for e in events if e.type == "lm.finished").data["usage"]
    (request,) = [r for r in scripted_lm.root_requests() if "no usage" in str(r["messages"])]  # this turn's only
    chars = sum(len(str(m["content"])) for m in request["messages"])
    assert usage["prompt_tokens"] == chars // 4 and usage["completion_tokens"] > 0  # not free
    assert events[-1].data["usage"]["prompt_tokens"] == usage["prompt_tokens"]


# ---------------------------------------------------------------------- calls dspy sends through LiteLLM

LITELLM_MODEL = "lm_studio/scripted"  # a provider dspy's native engine does not serve: the call goes through LiteLLM


def test_the_litellm_model_goes_through_litellm() -> None:
    """The tests below stream through LiteLLM only as long as dspy routes this model there."""
    import dspy
    from dspy.clients.backend_selection import select_backend

    lm = dspy.LM(LITELLM_MODEL, api_base="http://127.0.0.1:9/v1", api_key="k")
    assert not select_backend(lm).native
    assert select_backend(dspy.LM("openai/scripted", api_base="http://127.0.0.1:9/v1", api_key="k")).native


async def test_a_litellm_call_streams_and_uses_what_a_whole_reply_uses(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    import litellm

    priced = f"{LITELLM_MODEL}-priced"  # a price LiteLLM knows, so both ways report a cost to compare
    litellm.register_model({priced: {"input_cost_per_token": 1e-6, "output_cost_per_token": 3e-6, "mode": "chat",
                                     "litellm_provider": "lm_studio", "max_tokens": 4096}})  # fmt: skip
    scripted_lm.token_delay_s = 0.002
    steps = [
        step(LONG_REASONING, "```python\nprint(llm_query('what is 6*7?'))\n```"),
        step("Done.", "SUBMIT(answer='42')"),
    ]
    runs = {}
    for stream in (True, False):
        scripted_lm.add("*", steps)
        runner = await make_runner(f"[lm]\nstream = {json.dumps(stream)}\n", FLEET_LM_MODEL=priced)
        asked = len(scripted_lm.requests)
        events = await collect(runner, (await store.create_session()).session_id, "through litellm")
        runs[stream] = (events, scripted_lm.requests[asked:])
    (streamed, streamed_bodies), (whole, whole_bodies) = runs[True], runs[False]
    assert streamed[-1].type == "turn.completed" and streamed[-1].data["answer"] == "42"
    assert all(b.get("stream") is True and b["stream_options"] == {"include_usage": True} for b in streamed_bodies)
    assert [b.get("stream") for b in whole_bodies] == [None] * len(whole_bodies)
    types = [e.type for e in streamed]
    assert types.index("lm.delta") < types.index("lm.finished") < types.index("reasoning")
    assert deltas(streamed, "reasoning") == LONG_REASONING.strip() == streamed[types.index("reasoning")].data["text"]
    assert deltas(streamed, "code") == "print(llm_query('what is 6*7?'))"
    assert 2 <= sum(e.type == "lm.delta" and e.data["iteration"] == 1 for e in streamed) < 100  # coalesced
    assert not any(e.type == "lm.delta" for e in whole)

    def finished(events: list[Event]) -> list[dict[str, Any]]:
        keys = ("role", "usage", "cost_usd", "finish_reason")
        return [{k: e.data[k] for k in keys} for e in events if e.type == "lm.finished"]

    assert finished(streamed) == finished(whole) and finished(streamed)[0]["cost_usd"]  # priced, and the same
    assert streamed[-1].data["usage"] == whole[-1].data["usage"]
    caps = [{k: v for k, v in b.items() if "tokens" in k} for b in streamed_bodies]
    assert caps == [{k: v for k, v in b.items() if "tokens" in k} for b in whole_bodies] and caps[0]


@pytest.mark.slow
async def test_a_token_budget_stops_a_litellm_call_mid_stream(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.token_delay_s = 0.002
    # varied text: LiteLLM ends a stream that repeats one chunk 100 times (a model stuck in a loop)
    scripted_lm.add("*", [step(" ".join(f"{i:04d}" for i in range(8_000)), "print(1)")])  # 10,000 chunks
    runner = await make_runner("[limits]\nmax_turn_tokens = 4000\n", FLEET_LM_MODEL=LITELLM_MODEL)
    session = await store.create_session()
    events = await collect(runner, session.session_id, "think at length")
    assert events[-1].type == "turn.failed" and events[-1].data["error"]["type"] == "budget_exceeded"
    lm_finished = next(e for e in events if e.type == "lm.finished")
    assert lm_finished.data["finish_reason"] == "stopped"
    used = lm_finished.data["usage"]["prompt_tokens"] + lm_finished.data["usage"]["completion_tokens"]
    assert 4000 <= used < 4100
    await wait_for(lambda: bool(scripted_lm.streamed))
    assert scripted_lm.streamed[0] < 10_000 // 2 and scripted_lm.disconnects  # the provider request was closed
    assert len(scripted_lm.root_requests()) == 1  # not retried


@pytest.mark.parametrize("model", ["openai/scripted", LITELLM_MODEL])
async def test_a_stop_cuts_a_silent_stream_at_once(
    make_runner, store: Store, scripted_lm: ScriptedLM, model: str
) -> None:
    """The provider is between two tokens for 30 s: the stop closes its request now, not at the next token."""
    scripted_lm.add("*", [{**step("slowly", "print(1)"), "token_delay": 30}])
    runner = await make_runner(FLEET_LM_MODEL=model)
    handle = await runner.start((await store.create_session()).session_id, "wait for it")
    await wait_for(lambda: bool(scripted_lm.requests))
    import asyncio

    await asyncio.sleep(0.5)  # the stream is open: its first (empty) chunk is read, the next one is 30 s away
    stopped = time.monotonic()
    handle.cancel("stopped by the user")
    seen = [event async for event in handle.events()]
    assert seen[-1].type == "turn.cancelled" and time.monotonic() - stopped < 3
    await wait_for(lambda: bool(scripted_lm.disconnects), timeout=5)  # the provider saw the client leave
    assert scripted_lm.streamed and scripted_lm.streamed[0] <= 2
    assert len(scripted_lm.root_requests()) == 1  # and no retry opened another


@pytest.mark.parametrize("model", ["openai/scripted", LITELLM_MODEL])
async def test_the_providers_thinking_streams_live(
    make_runner, store: Store, scripted_lm: ScriptedLM, model: str
) -> None:
    thinking = "First I weigh the options, then I pick 42. " * 20
    scripted_lm.token_delay_s = 0.002
    scripted_lm.add("*", [{"reasoning": "Done.", "code": "SUBMIT(answer='42')", "reasoning_content": thinking}])
    runner = await make_runner(FLEET_LM_MODEL=model)
    events = await collect(runner, (await store.create_session()).session_id, "think aloud")
    assert events[-1].type == "turn.completed"
    types = [e.type for e in events]
    finished = events[types.index("lm.finished")]
    assert finished.data["reasoning_content"] == thinking
    assert deltas(events, "thinking") == thinking  # streamed live, the same text lm.finished keeps
    first_thought = next(i for i, e in enumerate(events) if e.type == "lm.delta" and e.data["field"] == "thinking")
    first_said = next(i for i, e in enumerate(events) if e.type == "lm.delta" and e.data["field"] == "reasoning")
    assert first_thought < first_said < types.index("lm.finished")  # the thinking comes before the reply
    from fleet_kernel.render import head_html
    from fleet_kernel.view import TurnView

    view = TurnView()
    for event in events[: types.index("lm.finished")]:
        view.apply(event)
    it = view.iterations[0]
    assert it.live_thinking == thinking and not it.thinking
    assert "the model's thinking (so far, " in head_html(it, live=True) and "<details>" in head_html(it, live=True)
    assert "thinking" not in head_html(it)  # a transcript shows only what lm.finished kept
    view.apply(finished)
    assert it.thinking == [thinking] and it.live_thinking == ""


async def test_a_cassette_records_a_litellm_call_as_a_stream(
    make_runner, store: Store, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    """The recorder sends a typed request, which dspy's LiteLLM engine answers in ``complete``: streamed too."""
    scripted_lm.token_delay_s = 0.002
    scripted_lm.add("*", [step(LONG_REASONING, "print('hi')"), step("Done.", "SUBMIT(answer='42')")])
    cassette = tmp_path / "litellm.cassette.json"
    recorder = await make_runner(FLEET_LM_MODEL=LITELLM_MODEL, FLEET_LM_RECORD=str(cassette))
    recorded = await collect(recorder, (await store.create_session()).session_id, "record me")
    assert recorded[-1].type == "turn.completed" and recorded[-1].data["answer"] == "42"
    assert deltas(recorded, "reasoning") == LONG_REASONING.strip()
    assert all(body.get("stream") is True for body in scripted_lm.root_requests())
    response = json.loads(cassette.read_text())["exchanges"][0]["response"]
    assert sum(size for _, size in response["stream"]) == len(response["text"]) and len(response["stream"]) > 100
    usage = next(e for e in recorded if e.type == "lm.finished").data["usage"]
    assert usage == {
        "prompt_tokens": response["usage"]["input_tokens"],
        "completion_tokens": response["usage"]["output_tokens"],
    }


class _Pub:
    """What a live view sends (the kernel's IOPub, without a kernel)."""

    def __init__(self) -> None:
        self.text = ""
        self.html: list[str] = []

    def display(self, data: dict[str, str], metadata: object = None, **_: object) -> None:
        self.html.append(data.get("text/html", ""))

    def stream(self, name: str, text: str) -> None:
        self.text += text


async def test_the_live_views_show_the_thinking_as_it_grows() -> None:
    from fleet_kernel.events import make_event
    from fleet_kernel.kernel.display import PlainLive, TextLive
    from fleet_kernel.view import TurnView

    delta = {"iteration": 1, "call_id": "lm-1"}
    finished = {"role": "root", "model": "m", "duration_ms": 1.0, "usage": {"prompt_tokens": 1, "completion_tokens": 9}}
    steps = [
        ("iteration.started", {"iteration": 1, "max_iters": 5}),
        ("lm.delta", {**delta, "field": "thinking", "text": "Weigh <a> "}),
        ("lm.delta", {**delta, "field": "thinking", "text": "against b."}),
        ("lm.delta", {**delta, "field": "reasoning", "text": "Pick a."}),
        ("lm.finished", {**finished, "reasoning_content": "Weigh <a> against b."}),
        ("reasoning", {"iteration": 1, "text": "Pick a."}),
    ]
    events = [make_event(t, d, seq=i + 1, session_id="s", turn_id="t") for i, (t, d) in enumerate(steps)]
    text_pub, plain_pub = _Pub(), _Pub()
    text = TextLive(text_pub, TurnView())  # type: ignore[arg-type]
    plain = PlainLive(plain_pub, TurnView())  # type: ignore[arg-type]
    for live in (text, plain):
        for event in events[:3]:
            live.on_event(event)
        live.flush()
    assert "thinking… " in text_pub.text and "Weigh" not in text_pub.text  # a terminal keeps it to one line
    assert "the model's thinking (so far, 20 characters)" in plain_pub.html[-1]  # collapsed, growing
    assert "Weigh &lt;a&gt; against b." in plain_pub.html[-1]  # escaped, inside the collapsed part
    for live in (text, plain):
        for event in events[3:]:
            live.on_event(event)
        await live.finish()
        live.close()
    assert "thinking… (20 characters)\n" in text_pub.text and "reasoning: Pick a." in text_pub.text
    assert "the model's thinking (20 characters)" in plain_pub.html[-1] and "so far" not in plain_pub.html[-1]
