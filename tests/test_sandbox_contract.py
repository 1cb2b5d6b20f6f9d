"""The sandbox contract: a backend is one module plus one registration, and every backend tells the model
the same things about its workspace (MEMORIES.md is kept per session)."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from live_api import LiveServer
from scripted_lm import ScriptedLM, step

from fleet_kernel import sandbox_registry
from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import ConfigError
from fleet_kernel.sandbox import contract, open_sandbox, status
from fleet_kernel.store import Store

NEW_BACKEND = "plain-python"
SHARED = [  # what every backend's instructions say, word for word ({root} is where the workspace is mounted)
    (
        "The working directory is {root}: attached files are in files/, save files for the user in artifacts/, "
        "memory/MEMORIES.md holds this session's notes."
    ),
    "A step may use 7 s",
]


@pytest.fixture
def new_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A backend from a module of its own, registered the way the built-ins are (by ``module:attribute``)."""
    module = tmp_path / "extra_backends" / "fleet_plain_python.py"
    module.parent.mkdir()
    module.write_text(
        textwrap.dedent('''
        """A second name for the real unsafe-local backend, as a plug-in module would define one."""
        from fleet_kernel.sandbox.local_backend import UNSAFE_LOCAL as BACKEND
    ''')
    )
    monkeypatch.syspath_prepend(str(module.parent))
    monkeypatch.setattr(
        sandbox_registry, "entries", dict(sandbox_registry.entries)
    )  # the registration ends with the test
    contract.register(NEW_BACKEND, "fleet_plain_python:BACKEND")
    return NEW_BACKEND


def test_unregistered_sandbox_is_refused_with_the_known_names(fleet_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({**fleet_env, "FLEET_SANDBOX": NEW_BACKEND})
    assert "FLEET_SANDBOX" in info.value.message
    assert all(repr(name) in info.value.message for name in contract.names())


def test_registered_backend_is_selectable_everywhere(
    new_backend: str, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    settings = load_settings({**fleet_env, "FLEET_SANDBOX": new_backend})
    assert settings.sandbox == new_backend and new_backend in contract.names()
    assert status(settings) == contract.Status(new_backend) and status(settings).detail == new_backend

    factory = open_sandbox(settings, tmp_path / "workspace")
    try:
        assert factory().execute("print(6 * 7)") == "42"
    finally:
        factory.close()

    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        deadline = time.monotonic() + 30
        while (health := http.get("/api/health").json())["sandbox"]["detail"].startswith("checking"):
            assert time.monotonic() < deadline, health  # probed in the background at start-up
            time.sleep(0.1)
        assert health["sandbox"] == {"ok": True, "detail": new_backend} and health["status"] == "ok"


async def test_a_turn_runs_on_the_registered_backend(
    new_backend: str, fleet_env: dict[str, str], store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [step("Compute.", "x = 6 * 7\nprint('got', x)"), step("Done.", "SUBMIT(answer=str(x))")])
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_SANDBOX": new_backend})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "What is six times seven?")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    assert events[0].type == "turn.started" and events[0].data["sandbox"] == new_backend
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "42", events[-1].data
    assert "got 42" in "".join(e.data["text"] for e in events if e.type == "output")
    prompt = json.dumps(scripted_lm.requests[0]["messages"])
    assert "MEMORIES.md holds this session's notes" in prompt


@pytest.mark.parametrize("name", contract.names())
def test_every_backend_gives_the_shared_instructions(name: str, fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[limits]\nexec_timeout_s = 7\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": name})
    workspace = tmp_path / "workspace"
    text = contract.get(name).instructions(settings, workspace)

    root = str(workspace.absolute()) if name == "unsafe-local" else "/workspace"
    own = text
    for sentence in SHARED:
        sentence = sentence.format(root=root)
        assert sentence in text, f"{name}: {sentence!r} missing from {text!r}"
        own = own.replace(sentence, "")
    assert "across sessions" not in text and text.count("MEMORIES.md") == 1
    assert text.startswith("Python ") and text.split(". ")[-1].startswith(SHARED[-1])
    # a backend adds what runs where and what differs, and never says again what the shared text says
    assert not [w for w in ("working directory", "A step may", "MEMORIES") if w in own], f"{name}: {own!r}"

    if contract.get(name).status(settings) is None and name != "daytona":  # opening Daytona creates a sandbox
        factory = open_sandbox(settings, workspace)
        try:
            assert factory.execution_instructions == text  # what the model is given is exactly this
        finally:
            factory.close()


def test_a_failed_bubblewrap_probe_is_tried_again_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe that failed once (a loaded machine) must not move every later turn to another backend."""
    from fleet_kernel.sandbox import _probe

    monkeypatch.setattr(_probe, "_probe_passed", False)
    monkeypatch.setattr(_probe, "_probe_failures", set())
    answers = iter(["bubblewrap failed to run: timed out", "bubblewrap failed to run: timed out", None])
    monkeypatch.setattr(_probe, "_probe_bwrap_once", lambda: next(answers))
    with caplog.at_level("WARNING", logger=_probe.__name__):
        assert _probe.probe_bwrap() == "bubblewrap failed to run: timed out"
        assert _probe.probe_bwrap() == "bubblewrap failed to run: timed out"
        assert _probe.probe_bwrap() is None  # tried again, and now it works
        assert _probe.probe_bwrap() is None  # a pass is kept: no fourth probe (the iterator is spent)
    assert [r.getMessage() for r in caplog.records].count(
        "the local sandbox cannot start here: bubblewrap failed to run: timed out"
    ) == 1
