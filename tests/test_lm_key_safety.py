"""The LM key stays where the operator put it: which models a session may choose (the engine's one rule),
replay cassettes only from the cassettes folder unless the operator named one, no key in the logs, and
``fleet doctor lm`` naming in Fleet's words the variable to set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live_api import run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine.session_config import cassette_path, check_model
from fleet_kernel.errors import ValidationError
from fleet_kernel.kernel.sidecar import spawn_sidecar

ROOT = Path(__file__).resolve().parents[1]
FLEET_KEY = "sk-fleet-operator-key-0123456789"
PROVIDER_KEY = "sk-openai-provider-key-9876543210"


def hosted(home: Path, **env: str) -> dict[str, str]:
    return {"FLEET_HOME": str(home), "FLEET_LM_MODEL": "openai/gpt-4.1-mini", "FLEET_LM_API_KEY": FLEET_KEY, **env}


def test_a_session_may_choose_models_of_the_configured_providers_only(tmp_path: Path) -> None:
    settings = load_settings(hosted(tmp_path, FLEET_SUB_LM_MODEL="anthropic/claude-haiku-4-5"))
    for model in ("openai/gpt-4.1", "anthropic/claude-sonnet-4-5", "openai/gpt-4.1-mini"):
        check_model(model, settings)
    for model in ("ollama/m", "llamafile/m", "gpt-4.1", "hosted_vllm/m"):
        with pytest.raises(ValidationError, match=r"\[lm\] allowed_models") as refused:
            check_model(model, settings)
        assert refused.value.code == "model_not_allowed" and FLEET_KEY not in refused.value.message
    # %fleet model changes the kernel's model; what the operator configured still decides
    moved = settings.model_copy(update={"lm_model": "openai/gpt-4.1"})
    with pytest.raises(ValidationError):
        check_model("ollama/m", moved)


def test_without_a_fleet_key_or_with_a_fixed_base_url_any_model_may_be_chosen(tmp_path: Path) -> None:
    # dspy/LiteLLM send each provider only its own key variable; a base URL fixes where the key goes
    check_model("ollama/m", load_settings({"FLEET_HOME": str(tmp_path)}))
    check_model("ollama/m", load_settings({"FLEET_HOME": str(tmp_path), "FLEET_LM_API_KEY": FLEET_KEY,
                                           "FLEET_LM_BASE_URL": "http://127.0.0.1:9/v1"}))  # fmt: skip
    with pytest.raises(ValidationError):
        check_model("ollama/m", load_settings({"FLEET_HOME": str(tmp_path), "FLEET_LM_API_KEY": FLEET_KEY}))


def test_the_operators_cassette_is_read_where_it_is_a_sessions_only_from_the_folder(tmp_path: Path) -> None:
    operator = tmp_path / "elsewhere" / "demo.json"
    settings = load_settings({"FLEET_HOME": str(tmp_path / "home"), "FLEET_LM_MODEL": f"replay/{operator}"})
    assert cassette_path(f"replay/{operator}", settings) == operator
    assert cassette_path("replay/a/b.json", settings) == (tmp_path / "home" / "cassettes" / "a" / "b.json").resolve()
    (tmp_path / "home" / "cassettes").mkdir(parents=True)
    (tmp_path / "home" / "cassettes" / "link.json").symlink_to(operator)
    for model in (f"replay/{tmp_path / 'other.json'}", "replay/../fleet.db", "replay/link.json"):
        with pytest.raises(ValidationError, match=r"\[lm\] cassettes_dir"):
            check_model(model, settings)


def test_provider_key_variables_are_secrets_too(tmp_path: Path) -> None:
    env = hosted(tmp_path, OPENAI_API_KEY=PROVIDER_KEY, AWS_SECRET_ACCESS_KEY="aws-secret-value-1234", DEBUG="1",
                 FLEET_LM_BASE_URL="https://user:url-password-555@llm.example/v1")  # fmt: skip
    redactor = load_settings(env).redactor
    text = f"a {FLEET_KEY} b {PROVIDER_KEY} c aws-secret-value-1234 d 1 e url-password-555"
    assert redactor.text(text) == "a *** b *** c *** d 1 e ***"


def test_the_kernel_log_has_no_key(tmp_path: Path) -> None:
    code = (
        "import logging\n"
        "from fleet_kernel.kernel.context import route_output_to_log\n"
        "route_output_to_log()\n"
        f"logging.getLogger('x').warning('calling with %s', {PROVIDER_KEY!r})\n"
        f"try:\n    raise RuntimeError({FLEET_KEY!r})\n"
        "except RuntimeError:\n    logging.getLogger('x').exception('failed')\n"
    )
    env = {**os.environ, **hosted(tmp_path, OPENAI_API_KEY=PROVIDER_KEY), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    log = (tmp_path / "logs" / "kernel.log").read_text()
    assert "calling with ***" in log and "RuntimeError: ***" in log
    assert FLEET_KEY not in log and PROVIDER_KEY not in log


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_the_api_log_has_no_key(tmp_path: Path, workers: int) -> None:
    """``fleet serve`` (its log is ``$FLEET_HOME/logs/api-PORT.log``) logs a name that carries both keys: the
    model wrote an artifact named after them, too large to collect, and the server says so in its log. With
    ``--workers 2`` the line is a worker process's, which sets up its own logging."""
    (tmp_path / "fleet.toml").write_text("[storage]\nmax_artifact_mb = 0.001\n")  # about 1 KB
    name = f"{FLEET_KEY}-{PROVIDER_KEY}.txt"
    code = f"open('/workspace/artifacts/{name}', 'w').write('x' * 4096)\nSUBMIT(answer='written')"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with ScriptedLM({"*": [step("Write it.", code)]}) as lm:
        env = lm.env(FLEET_HOME=str(tmp_path / "home"), FLEET_CONFIG=str(tmp_path / "fleet.toml"),
                     FLEET_LM_API_KEY=FLEET_KEY, OPENAI_API_KEY=PROVIDER_KEY)  # fmt: skip
        process = spawn_sidecar(port, env=env, wait_s=60, workers=workers)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                session = client.post("/api/sessions", json={"title": "keys"}).json()["session_id"]
                frames = run_turn(client, session, "write")
                assert frames[-1].event == "turn.completed", frames[-1].data
        finally:
            process.terminate()
            process.wait(20)
    log = (tmp_path / "home" / "logs" / f"api-{port}.log").read_text()
    assert "is 4096 bytes, over storage.max_artifact_mb" in log, log  # the line was written
    assert FLEET_KEY not in log and PROVIDER_KEY not in log
    assert "artifacts/***-***.txt is 4096 bytes" in log


def doctor_lm(home: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_kernel.cli", "doctor", "lm"],
        check=False,
        cwd=ROOT,
        env={**os.environ, "FLEET_HOME": str(home), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stdout.splitlines() if " lm: " in line]
    assert len(lines) == 1 and lines[0].startswith("[FAIL] lm: "), result.stdout + result.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FLEET_LM_MODEL": "openai/gpt-4.1-mini"}, ["FLEET_LM_API_KEY", "OPENAI_API_KEY"]),
        ({"FLEET_LM_MODEL": "opneai/gpt-4.1-mini", "FLEET_LM_API_KEY": FLEET_KEY}, ["FLEET_LM_MODEL", "opneai"]),
        ({"FLEET_LM_BASE_URL": "http://127.0.0.1:9/v1"}, ["FLEET_LM_MODEL is not set", "http://127.0.0.1:9/v1"]),
    ],
    ids=["missing-key", "misspelled-provider", "base-url-alone"],
)
def test_doctor_lm_names_the_variable_to_set(tmp_path: Path, env: dict[str, str], names: list[str]) -> None:
    line = doctor_lm(tmp_path, env)
    for name in names:
        assert name in line, line
    for wording in ("api_key=", "dspy.LM", "Huggingface", "completion(model="):
        assert wording not in line, line
    assert FLEET_KEY not in line
