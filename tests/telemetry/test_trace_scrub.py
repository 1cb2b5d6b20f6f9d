"""What traces carry of secrets and of printed output: no key in any form (Fleet's own variables or the
provider variables LiteLLM reads), and, with content capture off, nothing a step printed, not even in the
error message of a step that failed. Real runner, real sandbox, scripted LM, a loopback OTLP collector."""

from __future__ import annotations

import pytest
from otlp_receiver import OTLPReceiver
from scripted_lm import ScriptedLM, step
from test_traces import by_name, collect, make_runner, turn_done

from fleet_kernel.store import Store

__all__ = ["make_runner"]  # the fixture, shared with test_traces

FLEET_KEY = "sk-fleet-operator-key-0123456789"
PROVIDER_KEY = "sk-anthropic-provider-key-9876543210"


async def test_no_key_reaches_events_or_traces(
    make_runner, store: Store, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEY)
    code = f"print('keys:', {FLEET_KEY!r}, {PROVIDER_KEY!r})\nraise ValueError({FLEET_KEY!r})"
    scripted_lm.add("keys", [step(f"Use {PROVIDER_KEY}.", code), step("Done.", f"SUBMIT(answer={FLEET_KEY!r})")])
    with OTLPReceiver() as collector:
        runner = await make_runner(
            collector.endpoint, FLEET_TRACE_CONTENT="1", FLEET_LM_API_KEY=FLEET_KEY, ANTHROPIC_API_KEY=PROVIDER_KEY
        )
        session = await store.create_session()
        events = await collect(runner, session.session_id, f"keys {FLEET_KEY} {PROVIDER_KEY}")
        collector.wait_for(turn_done(events[0].turn_id))
    assert events[-1].type == "turn.completed"
    stored = [e.to_json() for e in await store.events_after(events[0].turn_id, 0, limit=1000)]
    turn = await store.get_turn(events[0].turn_id)
    assert any("keys: ***" in e for e in stored)
    for key in (FLEET_KEY, PROVIDER_KEY):
        assert not any(key in e for e in stored)
        assert key not in turn.task and key not in (turn.answer or "")
        assert not any(key.encode() in body for body in collector.bodies)


async def test_without_content_capture_a_failed_step_sends_no_printed_output(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    code = "import sys\nprint('PRINTED-BY-THE-STEP')\nprint('WARNED-BY-THE-STEP', file=sys.stderr)\nraise ValueError('on purpose')"
    scripted_lm.add("fail once", [step("Break.", code), step("Done.", "SUBMIT(answer='ok')")])
    with OTLPReceiver() as collector:
        runner = await make_runner(collector.endpoint)
        session = await store.create_session()
        events = await collect(runner, session.session_id, "fail once")
        spans = collector.wait_for(turn_done(events[0].turn_id))
    finished = [e for e in events if e.type == "execution.finished" and e.data["error"]]
    assert finished and "PRINTED-BY-THE-STEP" in finished[0].data["error"]["message"]  # the event keeps it
    failed = [s for s in by_name(spans, "fleet.execute_code") if s.status_code == 2]
    assert failed and failed[0].status_message == "ValueError: on purpose"
    for marker in (b"PRINTED-BY-THE-STEP", b"WARNED-BY-THE-STEP", b"raise ValueError"):
        assert not any(marker in body for body in collector.bodies)
