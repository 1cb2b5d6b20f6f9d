"""Tests for fleet_kernel.cancel.CancelToken, and for each source that stops a turn through it: an
interrupt, a durable cancellation, the deadline and a used-up budget, in real turns of the real runner
(real sandbox, scripted LM on loopback)."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.budget import BudgetExceeded
from fleet_kernel.errors import TurnCancelled, TurnDeadlineExceeded
from fleet_kernel.events import Event
from fleet_kernel.store import Store

# ---------------------------------------------------------------------- the token


def test_the_first_reason_wins() -> None:
    token = CancelToken()
    assert not token.cancelled and token.reason is None and token.error() is None
    token.raise_if_cancelled()  # not cancelled: nothing happens
    assert token.cancel("interrupted") is True
    assert token.cancel("cancelled over HTTP", BudgetExceeded) is False
    assert token.cancelled and token.reason == "interrupted"
    with pytest.raises(TurnCancelled, match="interrupted") as raised:
        token.raise_if_cancelled()
    assert type(raised.value) is TurnCancelled


def test_cancelled_with_returns_what_the_turn_stops_with() -> None:
    """The deadline's path gets its cause in one call: its own when it cancels, the first one otherwise."""
    fresh = CancelToken()
    cause = fresh.cancelled_with("past the deadline", TurnDeadlineExceeded)
    assert type(cause) is TurnDeadlineExceeded and cause.reason == "past the deadline" and fresh.cancelled
    stopped = CancelToken()
    stopped.cancel("interrupted")
    cause = stopped.cancelled_with("past the deadline", TurnDeadlineExceeded)
    assert type(cause) is TurnCancelled and cause.reason == "interrupted"
    assert cause is not stopped.cancelled_with("again")  # a new exception each time, as ``error``


def test_the_kind_travels_with_the_reason() -> None:
    token = CancelToken()
    token.cancel("the turn used 7,000 LM tokens", BudgetExceeded)
    with pytest.raises(BudgetExceeded, match="7,000"):
        token.raise_if_cancelled()
    assert token.error() is not token.error()  # a new exception each time: threads never share a traceback


def test_callbacks_run_once_also_when_registered_after_the_cancel() -> None:
    token = CancelToken()
    calls: list[str] = []
    token.on_cancel(lambda: calls.append("before"))
    token.cancel("stop")
    token.cancel("again")
    assert calls == ["before"]
    token.on_cancel(lambda: calls.append("after"))  # runs at once
    assert calls == ["before", "after"]
    token.cancel("once more")
    assert calls == ["before", "after"]


def test_a_failing_callback_does_not_keep_the_others_from_running() -> None:
    token = CancelToken()
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    token.on_cancel(broken)
    token.on_cancel(lambda: calls.append("ran"))
    assert token.cancel("stop") is True
    assert calls == ["ran"]


def test_wait() -> None:
    token = CancelToken()
    assert token.wait(0.01) is False
    threading.Timer(0.05, token.cancel, args=("later",)).start()
    assert token.wait(10) is True and token.reason == "later"


def test_racing_cancels_and_registrations_are_safe() -> None:
    token = CancelToken()
    calls: list[int] = []
    lock = threading.Lock()
    won: list[str] = []
    start = threading.Barrier(32)

    def canceller(i: int) -> None:
        start.wait()
        if token.cancel(f"reason {i}"):
            won.append(f"reason {i}")

    def registrar(i: int) -> None:
        start.wait()

        def record() -> None:
            with lock:
                calls.append(i)

        token.on_cancel(record)

    threads = [threading.Thread(target=canceller if i % 2 else registrar, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert won == [token.reason]  # exactly one cancel won, and its reason is the token's
    assert sorted(calls) == list(range(0, 32, 2))  # every callback ran exactly once


# ---------------------------------------------------------------------- every source, through the runner


@pytest.fixture
async def make_runner(fleet_env: dict[str, str], tmp_path: Path, store: Store) -> AsyncIterator[Callable[..., Any]]:
    """Build a runner with ``[limits]`` from keyword arguments."""
    runners: list[TurnRunner] = []

    async def build(**limits: Any) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text("[limits]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in limits.items()))
        runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


SLEEP = step("Sleep.", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")


async def run_until_output(runner: TurnRunner, store: Store, act: Callable[[TurnRunner, Any], Any]) -> list[Event]:
    """Start a sleeping turn, call ``act(runner, handle)`` once its code prints, return all its events."""
    session = await store.create_session()
    handle = await runner.start(session.session_id, "sleep")
    events: list[Event] = []
    acted = False
    async for event in handle.events():
        events.append(event)
        if event.type == "output" and not acted:
            acted = True
            result = act(runner, handle)
            if hasattr(result, "__await__"):
                await result
    return events


async def test_an_interrupt_cancels_the_turn_with_its_reason(make_runner, store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("*", [SLEEP])
    runner = await make_runner()
    events = await run_until_output(runner, store, lambda r, handle: handle.cancel("interrupted"))
    assert events[-1].type == "turn.cancelled" and events[-1].data == {"reason": "interrupted"}
    assert (await store.get_turn(events[0].turn_id)).status == "cancelled"


async def test_a_durable_cancellation_cancels_the_turn_with_its_reason(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [SLEEP])
    runner = await make_runner()
    events = await run_until_output(
        runner, store, lambda r, handle: store.request_cancel(handle.run_id, "cancelled over HTTP")
    )
    assert events[-1].type == "turn.cancelled" and events[-1].data == {"reason": "cancelled over HTTP"}
    assert (await store.get_turn(events[0].turn_id)).status == "cancelled"


async def test_the_first_source_wins_over_a_later_one(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [SLEEP])
    runner = await make_runner()

    async def stop_then_cancel_over_http(r: TurnRunner, handle: Any) -> None:
        handle.cancel("stopped from the notebook")
        await store.request_cancel(handle.run_id, "cancelled over HTTP")  # what the API route does, too late
        assert r.cancel(handle.turn_id, "cancelled over HTTP")

    events = await run_until_output(runner, store, stop_then_cancel_over_http)
    assert events[-1].type == "turn.cancelled" and events[-1].data == {"reason": "stopped from the notebook"}


@pytest.mark.slow
async def test_the_deadline_fails_the_turn(make_runner, store, scripted_lm) -> None:
    scripted_lm.add("*", [SLEEP])
    runner = await make_runner(turn_timeout_s=2)
    events = await run_until_output(runner, store, lambda r, handle: None)
    assert events[-1].type == "turn.failed"
    error = events[-1].data["error"]
    assert error["type"] == "deadline_exceeded" and "2 s deadline (limits.turn_timeout_s)" in error["message"]
    row = await store.get_turn(events[0].turn_id)
    assert row.status == "failed" and row.error["type"] == "deadline_exceeded"


async def test_a_used_up_budget_fails_the_turn(make_runner, store, scripted_lm) -> None:
    scripted_lm.default = step("Keep looking.", "print('still looking')")
    runner = await make_runner(max_iters=20, max_turn_tokens=3000)
    session = await store.create_session()
    handle = await runner.start(session.session_id, "never finish")
    events = [event async for event in handle.events()]
    assert events[-1].type == "turn.failed"
    error = events[-1].data["error"]
    assert error["type"] == "budget_exceeded" and "limits.max_turn_tokens" in error["message"]
    assert error["message"].endswith(": the turn was stopped")
    row = await store.get_turn(handle.turn_id)
    assert row.status == "failed" and row.error["type"] == "budget_exceeded"
