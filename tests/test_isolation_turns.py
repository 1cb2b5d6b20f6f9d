"""Isolation at the turn level: real TurnRunner turns, scripted LM, on every sandbox CI can run (local, pyodide).

A hostile step that takes the sandbox down (segfault, SIGKILL) is an error the model reads, and the turn
goes on; a step that breaks the sandbox's protocol ends the turn with a readable ``turn.failed``; either
way the next turn of the same session works. Model code dumps the environment and every
``/proc/*/environ`` it can read (also reversed and hex-encoded, which the engine's secret scrubbing would
not catch), and the LM key set in the host's environment is in no event, no row of any store table, no
notebook transcript and no artifact; a canary printed next to it proves each place was searched.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from scripted_lm import ScriptedLM, step
from sqlalchemy import inspect, text

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import Event
from fleet_kernel.store import Store
from fleet_kernel.transcript import session_notebook
from fleet_kernel.workspace import Workspace

BACKENDS = ("local", "pyodide")
SECRET = f"sk-isolation-{uuid.uuid4().hex}"
CANARY = "ISOLATION-CANARY"


def forms(value: str) -> list[str]:
    """How the model's code below writes what it found: as is, reversed, hex-encoded."""
    return [value, value[::-1], value.encode().hex()]


# The same snooping on every backend: everything the code can learn of environments, and a canary.
SNOOP = f"""
import os
dump = [repr(dict(os.environ))]
for pid in (os.listdir('/proc') if os.path.isdir('/proc') else []):
    for name in ('environ', 'cmdline'):
        try:
            dump.append(open(f'/proc/{{pid}}/{{name}}', 'rb').read().decode('latin-1'))
        except OSError:
            pass
try:
    import js
    for attempt in (lambda: js.Deno.env.toObject(), lambda: js.Deno.env.get('FLEET_LM_API_KEY')):
        try:
            dump.append(repr(attempt()))
        except Exception as exc:
            dump.append(str(exc))
except ImportError:
    pass
dump.append({CANARY[:9]!r} + {CANARY[9:]!r})
dump.append(open('/workspace/files/notes.txt').read())
found = chr(10).join(dump)
print(found)
print(found[::-1])
print(found.encode().hex())
open('/workspace/artifacts/snoop.txt', 'w').write(found + found[::-1] + found.encode().hex())
"""

# Steps that take the worker down, the same program on every backend.
CRASHES = {
    "segfault": "import faulthandler\nprint('about to crash', flush=True)\nfaulthandler._sigsegv()",
    "sigkill": "import os, time\nprint('about to die', flush=True)\ntime.sleep(0.2)\nos.kill(os.getpid(), 9)",
}

# Writes a line that is not a protocol message into the worker's own end of the channel.
BREAK_PROTOCOL = """
try:
    import _fleet_bridge  # Pyodide: the runner's bridge
    _fleet_bridge.write('this is not a protocol message')
except ImportError:
    import gc, io, os
    fd = min(f.fileno() for f in gc.get_objects() if isinstance(f, io.BufferedWriter) and f.fileno() > 2)
    os.write(fd, b'this is not a protocol message' + bytes([10]))
import time
time.sleep(5)
"""


def unavailable(backend: str) -> str | None:
    if backend == "local":
        from fleet_kernel.sandbox import probe_bwrap

        return probe_bwrap()
    from fleet_kernel.sandbox.pyodide import probe_pyodide

    return probe_pyodide()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if (reason := unavailable(request.param)) is not None:
        pytest.skip(f"{request.param} sandbox unavailable: {reason}")
    monkeypatch.setenv("FLEET_LM_API_KEY", SECRET)  # in the host's own environment, as in production
    assert os.environ["FLEET_LM_API_KEY"] == SECRET
    return str(request.param)


@pytest.fixture
async def runner(backend: str, fleet_env: dict[str, str]) -> AsyncIterator[Callable[[Store], Any]]:
    made: list[TurnRunner] = []

    async def build(store: Store) -> TurnRunner:
        settings = load_settings({**fleet_env, "FLEET_SANDBOX": backend, "FLEET_LM_API_KEY": SECRET})
        assert settings.lm_api_key is not None and settings.lm_api_key.get_secret_value() == SECRET
        made.append(await TurnRunner(store, settings).open())
        return made[-1]

    yield build
    for each in made:
        await each.close()


async def collect(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    return [event async for event in handle.events()]


async def new_session(store: Store, settings: Settings) -> str:
    """A session with an attachment, as the API makes one (so the attachments table has a row too)."""
    session = await store.create_session("isolation")
    data = b"attached notes\n"
    path = Workspace.for_session(settings.workspaces_dir, session.session_id).add_file("notes.txt", data)
    await store.add_attachment(
        session_id=session.session_id, filename="notes.txt", path=path, mime="text/plain", data=data
    )
    return session.session_id


async def store_rows(store: Store) -> dict[str, str]:
    """Every row of every table, as text (bytes as latin-1), per table."""
    async with store.engine.connect() as conn:
        tables = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        found = {}
        for table in tables:
            rows = (await conn.execute(text(f'SELECT * FROM "{table}"'))).all()
            found[table] = "\n".join(
                " | ".join(
                    bytes(value).decode("latin-1") if isinstance(value, (bytes, memoryview)) else str(value)
                    for value in row
                )
                for row in rows
            )
    return found


async def assert_key_is_nowhere(store: Store, session_id: str, settings: Settings) -> None:
    events = json.dumps([e.model_dump() for e in await store.session_events(session_id)])
    rows = await store_rows(store)
    for table in ("sessions", "turns", "events", "attachments", "artifacts", "blobs"):
        assert rows.get(table), f"table {table} is missing or empty"
    notebook = nbformat.writes(await session_notebook(store, session_id))
    workspace = "\n".join(
        path.read_bytes().decode("latin-1")
        for path in Workspace(settings.workspaces_dir / session_id).root.rglob("*")
        if path.is_file()
    )
    places = {
        "events": events,
        "notebook": notebook,
        "workspace": workspace,
        **{f"table {t}": v for t, v in rows.items()},
    }
    for place in ("events", "notebook", "workspace", "table events", "table blobs"):
        assert CANARY in places[place], place  # what the code found did arrive there, so that place was searched
    for place, content in places.items():
        for form in forms(SECRET):
            assert form not in content, f"the LM key ({form[:12]}...) is in {place}"
    if settings.database_url.startswith("sqlite") and "///" in settings.database_url:
        database = Path(settings.database_url.split("///", 1)[1])
        for path in database.parent.glob(database.name + "*"):  # the file, its WAL and journal
            raw = path.read_bytes()
            assert all(form.encode() not in raw for form in forms(SECRET)), path


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


@pytest.mark.slow
@pytest.mark.parametrize("crash", sorted(CRASHES))
async def test_a_crash_is_an_error_the_model_reads_and_the_session_goes_on(
    backend: str, crash: str, runner: Any, store: Store, settings: Settings, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [
        step("Look around.", SNOOP),
        step("Crash.", f"x = 1\n{CRASHES[crash]}"),
        step("Go on.", "print('alive again', 'x' in globals())\nSUBMIT(answer='recovered')"),
    ])  # fmt: skip
    fleet = await runner(store)
    session_id = await new_session(store, settings)
    events = await collect(fleet, session_id, "snoop then crash")

    assert events[0].data["sandbox"] == backend
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "recovered", events[-1].data
    errors = [e.data["error"] for e in events if e.type == "execution.finished" and e.data["error"]]
    assert len(errors) == 1 and "It was restarted" in errors[0]["message"], errors
    outputs = "".join(e.data["text"] for e in events if e.type == "output")
    assert "alive again False" in outputs  # a new worker: the variables are gone, and the model was told so
    seen_by_model = json.dumps(scripted_lm.requests[-1])
    assert "It was restarted" in seen_by_model and "variables, imports and functions" in seen_by_model
    assert [e.data["path"] for e in events if e.type == "artifact"] == ["artifacts/snoop.txt"]

    scripted_lm.add(
        "*", [step("Again.", "print(len(open('/workspace/artifacts/snoop.txt').read()) > 0)\nSUBMIT(answer='second')")]
    )
    events = await collect(fleet, session_id, "the next turn")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "second", events[-1].data
    assert "True" in "".join(e.data["text"] for e in events if e.type == "output")
    await assert_key_is_nowhere(store, session_id, settings)


@pytest.mark.slow
async def test_a_broken_protocol_ends_the_turn_readably_and_the_next_turn_works(
    backend: str, runner: Any, store: Store, settings: Settings, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [step("Look around.", SNOOP), step("Break it.", BREAK_PROTOCOL)])
    fleet = await runner(store)
    session_id = await new_session(store, settings)
    events = await collect(fleet, session_id, "snoop then break the channel")

    assert events[-1].type == "turn.failed", events[-1].data
    error = events[-1].data["error"]
    assert error["type"] == "sandbox_error" and "broke protocol" in error["message"], error
    assert "this is not a protocol message" in error["message"]  # what the sandbox sent, for whoever debugs it
    assert (await store.get_turn(events[0].turn_id)).status == "failed"

    scripted_lm.add("*", [step("Again.", "SUBMIT(answer='second')")])
    events = await collect(fleet, session_id, "the next turn")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "second", events[-1].data
    await assert_key_is_nowhere(store, session_id, settings)
