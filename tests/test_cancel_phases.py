"""Cancelling a turn is prompt in every phase: before it runs, while its sandbox starts (or waits for a slot),
while its LM call is in flight, while its code runs, and while its artifacts are collected. Real runner, store,
sandbox and pool; the scripted LM. Bounds are liveness bounds, far above what a prompt cancel takes."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import SandboxLimits, load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import TurnCancelled
from fleet_kernel.events import Event
from fleet_kernel.sandbox import _slots, pool, probe_bwrap
from fleet_kernel.sandbox.local import ProcessSession
from fleet_kernel.store import Store

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")

LIVENESS_S = 30.0  # a prompt cancel takes well under a second; today's slow paths take 60 s or the deadline


@pytest.fixture
def own_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[pool.Pool]:
    fresh = pool.Pool()
    monkeypatch.setattr(pool, "POOL", fresh)
    yield fresh
    fresh.close()


@pytest.fixture
async def make_runner(
    fleet_env: dict[str, str], tmp_path: Path, store: Store, own_pool: pool.Pool
) -> AsyncIterator[Callable[..., Any]]:
    """A runner on the local sandbox with ``fleet.toml`` sections from keyword arguments (dicts)."""
    runners: list[TurnRunner] = []

    async def build(**sections: dict[str, Any]) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text(
            "".join(
                f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
                for name, keys in sections.items()
            )
        )
        settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": "local"})
        runner = await TurnRunner(store, settings).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def wait_until(check: Callable[[], bool], timeout_s: float = LIVENESS_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        await asyncio.sleep(0.02)


async def ends_cancelled(runner: TurnRunner, store: Store, turn_id: str) -> list[Event]:
    """The turn reaches ``cancelled`` within the liveness bound, and the store agrees with its events."""
    events: list[Event] = []

    async def read() -> None:
        async for event in runner.follow(turn_id):
            events.append(event)

    await asyncio.wait_for(read(), LIVENESS_S)
    assert events[-1].type == "turn.cancelled", [e.type for e in events]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap, nothing after the end
    assert sum(e.terminal for e in events) == 1
    assert any(e.type == "lm.finished" for e in events)  # every turn reports its LM step
    row = await store.get_turn(turn_id)
    assert row.status == "cancelled" and row.finished_at is not None
    artifacts = await store.list_artifacts(row.session_id, turn_id)
    assert len(artifacts) == sum(e.type == "artifact" for e in events)
    await wait_until(lambda: not runner.is_running_here(turn_id))
    return events


async def the_session_runs_again(runner: TurnRunner, scripted_lm: ScriptedLM, session_id: str) -> None:
    scripted_lm.add("and again", [step("Answer.", "SUBMIT(answer='again')")])
    handle = await runner.start(session_id, "and again")
    row = await asyncio.wait_for(handle.wait(), LIVENESS_S * 2)
    assert row.status == "completed", row.error


async def test_cancel_before_the_turn_runs(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("never asked", [step("Work.", "print('ran')")])
    runner = await make_runner(sandbox={"pool_size": 0})
    session = await store.create_session()
    handle = await runner.start(session.session_id, "never asked")
    handle.cancel("stopped at once")
    events = await ends_cancelled(runner, store, handle.turn_id)
    assert events[-1].data["reason"] == "stopped at once"
    await the_session_runs_again(runner, scripted_lm, session.session_id)


@pytest.mark.slow
async def test_cancel_while_the_sandbox_starts(
    make_runner, store: Store, scripted_lm: ScriptedLM, own_pool: pool.Pool
) -> None:
    runner = await make_runner(sandbox={"pool_size": 1})
    await wait_until(lambda: own_pool.ready() == 1, 60)
    stage = psutil.Process(own_pool._ready[0]._process.pid)  # type: ignore[union-attr]
    stage.send_signal(signal.SIGSTOP)  # it never answers the adoption: a sandbox stuck starting
    try:
        scripted_lm.add("stuck start", [step("Work.", "print('ran')")])
        session = await store.create_session()
        handle = await runner.start(session.session_id, "stuck start")
        await wait_until(lambda: own_pool.handed_out == 1)  # the turn took it and waits for it to adopt
        handle.cancel("stopped while starting")
        await ends_cancelled(runner, store, handle.turn_id)
        # the stuck sandbox is gone too, not left to a 60 s timeout (and holding its slot meanwhile)
        await wait_until(lambda: not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE)
    finally:
        if stage.is_running():
            stage.send_signal(signal.SIGCONT)
    await the_session_runs_again(runner, scripted_lm, session.session_id)


def test_cancel_while_the_sandbox_waits_for_a_slot(tmp_path: Path, private_slots: Path) -> None:
    holder = _slots.acquire(1)  # the machine's one slot is taken
    assert holder is not None
    from fleet_kernel.sandbox.interpreter import SandboxInterpreter

    (tmp_path / "ws").mkdir()
    token = CancelToken()
    interpreter = SandboxInterpreter(
        lambda: ProcessSession(tmp_path / "ws", SandboxLimits(max_sandboxes=1), isolated=True),
        exec_timeout_s=20,
        cancel=token,
    )
    token.on_cancel(interpreter.interrupt)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            interpreter.execute("print(1)")
        except BaseException as exc:  # noqa: BLE001 - what the turn's thread sees
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + LIVENESS_S
    while not any(p.name[0] != "." for p in (_slots.folder() / "waiting").iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    token.cancel("stopped while waiting")
    thread.join(LIVENESS_S / 3)  # today it waits for the slot (30 s) before it notices
    assert not thread.is_alive() and isinstance(raised[0], TurnCancelled), raised
    holder.release()
    interpreter.shutdown()


async def test_cancel_while_the_lm_call_is_in_flight(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow model", [{"delay": 120, **step("Think.", "print('late')")}])
    runner = await make_runner(sandbox={"pool_size": 0})
    session = await store.create_session()
    handle = await runner.start(session.session_id, "slow model")
    await wait_until(lambda: any("slow model" in json.dumps(r) for r in scripted_lm.requests))
    handle.cancel("stopped while the model thinks")
    await ends_cancelled(runner, store, handle.turn_id)
    await wait_until(lambda: any("slow model" in json.dumps(r) for r in scripted_lm.disconnects))  # call ended
    await the_session_runs_again(runner, scripted_lm, session.session_id)


async def test_cancel_while_code_that_ignores_interrupts_runs(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    stubborn = "import time\nprint('running', flush=True)\nwhile True:\n    try:\n        time.sleep(1)\n    except BaseException:\n        pass"
    scripted_lm.add("stubborn code", [step("Loop.", stubborn)])
    runner = await make_runner(sandbox={"pool_size": 0})
    session = await store.create_session()
    handle = await runner.start(session.session_id, "stubborn code")
    async for event in runner.follow(handle.turn_id):
        if event.type == "output":
            break
    handle.cancel("stopped while code runs")
    await ends_cancelled(runner, store, handle.turn_id)
    await the_session_runs_again(runner, scripted_lm, session.session_id)


async def test_cancel_while_artifacts_are_collected(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    many = (
        "import os\nfor n in range(50):\n"
        "    with open(f'artifacts/part-{n:02d}.bin', 'wb') as f:\n        f.write(os.urandom(1 << 20))\n"
        "SUBMIT(answer='written')"
    )
    scripted_lm.add("many artifacts", [step("Write.", many)])
    runner = await make_runner(sandbox={"pool_size": 0}, limits={"turn_timeout_s": 600})
    session = await store.create_session()
    handle = await runner.start(session.session_id, "many artifacts")
    async for event in runner.follow(handle.turn_id):
        if event.type == "artifact":  # collection has begun, 49 files to go
            handle.cancel("stopped while collecting")
            break
    events = await ends_cancelled(runner, store, handle.turn_id)
    assert sum(e.type == "artifact" for e in events) < 50  # collection stopped; what it stored is consistent
    await the_session_runs_again(runner, scripted_lm, session.session_id)
